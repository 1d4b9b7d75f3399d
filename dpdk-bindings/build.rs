//! Generates Rust bindings for Debian's DPDK 22.11 and compiles the wrappers for DPDK's
//! static inline API (rx/tx burst, mbuf and ring helpers, rte_softrss), which otherwise
//! have no symbol to link against.
use std::env;
use std::path::PathBuf;

const SETUP_HINT: &str =
    "run `sudo scripts/setup.sh` (installs dpdk, libdpdk-dev, libclang-dev, pkg-config)";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=shim.c");
    println!("cargo:rerun-if-changed=build.rs");

    let dpdk = pkg_config::Config::new()
        .atleast_version("22.11")
        .cargo_metadata(false)
        .probe("libdpdk")
        .unwrap_or_else(|e| fail(&format!("libdpdk >= 22.11 not found by pkg-config ({e})")));

    // pkg-config's cflags carry `-include rte_config.h -march=corei7`: bindgen and cc must
    // see exactly the same flags, or struct layouts and inline code disagree.
    let cflags = cflags("libdpdk");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wrappers_c = out.join("static_wrappers.c");

    if !libclang_present() {
        fail("libclang not found (bindgen needs it)");
    }

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(cflags.iter())
        .clang_arg("-DALLOW_EXPERIMENTAL_API")
        .allowlist_function("rte_.*")
        .allowlist_function("sluice_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*")
        .allowlist_var("SLUICE_.*")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_var("RING_F_.*")
        // These packed/aligned headers make rustc reject the generated layout.
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .opaque_type("rte_arp_hdr")
        .opaque_type("rte_arp_ipv4")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(out.join("static_wrappers"))
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed on wrapper.h ({e})")));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");

    let mut build = cc::Build::new();
    build
        .file(&wrappers_c)
        .file("shim.c")
        .include(env::current_dir().unwrap())
        .define("ALLOW_EXPERIMENTAL_API", None)
        .flag("-Wno-deprecated-declarations")
        .flag("-Wno-unused-parameter")
        .flag("-Wno-duplicate-decl-specifier")
        .opt_level(3);
    for f in &cflags {
        build.flag(f);
    }
    build.compile("sluice_dpdk_shim");

    for dir in &dpdk.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    for lib in &dpdk.libs {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // rte_eth_from_rings lives in the net_ring PMD, which libdpdk.pc does not list for
    // shared linking.
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");
}

fn cflags(lib: &str) -> Vec<String> {
    let out = std::process::Command::new("pkg-config")
        .args(["--cflags", lib])
        .output()
        .unwrap_or_else(|e| fail(&format!("pkg-config not runnable ({e})")));
    let text = String::from_utf8_lossy(&out.stdout);
    // Split on whitespace but keep `-include rte_config.h` as two arguments in order.
    text.split_whitespace().map(str::to_owned).collect()
}

fn libclang_present() -> bool {
    if env::var_os("LIBCLANG_PATH").is_some() {
        return true;
    }
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib",
        "/usr/lib64",
        "/usr/local/lib",
    ];
    dirs.iter().any(|d| {
        std::fs::read_dir(d).ok().is_some_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
        }) || std::fs::read_dir(d).ok().is_some_and(|rd| {
            rd.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("llvm-")
                    && e.path().join("lib").read_dir().ok().is_some_and(|mut l| {
                        l.any(|x| {
                            x.map(|x| x.file_name().to_string_lossy().starts_with("libclang"))
                                .unwrap_or(false)
                        })
                    })
            })
        })
    })
}

fn fail(what: &str) -> ! {
    eprintln!("error: {what}; {SETUP_HINT}");
    println!("cargo:warning={what}; {SETUP_HINT}");
    std::process::exit(1);
}
