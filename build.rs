//! Build-time check: the DPDK we compile against must be >= 22.11, the API our bindings
//! and shim are written for. dpdk-sys finds the library; this only re-checks the version
//! so the failure names the fix at the top level too.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(e) = pkg_config_version("libdpdk", "22.11") {
        println!("cargo:warning={e}");
        panic!("{e}");
    }
}

fn pkg_config_version(lib: &str, min: &str) -> Result<(), String> {
    let ok = std::process::Command::new("pkg-config")
        .args([&format!("--atleast-version={min}"), lib])
        .status()
        .map_err(|e| format!("pkg-config not runnable ({e}); run scripts/setup.sh as root"))?;
    if ok.success() {
        Ok(())
    } else {
        Err(format!(
            "{lib} >= {min} not found by pkg-config; run scripts/setup.sh as root to install DPDK"
        ))
    }
}
