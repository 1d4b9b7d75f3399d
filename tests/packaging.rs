//! The Debian package (scripts/package.sh), checked with Debian's own tools: built from
//! the release binaries under test, installed with `dpkg --root` into a scratch root
//! (files, modes, the conffile registered and kept across a reinstall over a local
//! edit), its control fields read back with `dpkg-deb -I`, `lintian` clean, each man
//! page rendered by `man -l` and listing every option `--help` lists (and
//! sluice.toml(5) every key of docs/CONFIG.md), the unit accepted by
//! `systemd-analyze verify`, and the bash completion offering --help's commands.
//!
//! Run: `cargo test --release --test integration packaging::` (as root; 16-25 s, most of it
//! lintian and stripping and compressing the binaries).

use crate::common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `cmd`, bounded; panics with its output unless it succeeds.
fn ok(cmd: &mut Command, secs: u64) -> CmdOutput {
    let out = run_bounded(cmd, Duration::from_secs(secs));
    assert!(out.success(), "{}", out.describe());
    out
}

/// Builds the package from the binaries under test into `dir`; returns the .deb.
fn build(dir: &Path) -> PathBuf {
    let bin = Path::new(SLUICE).parent().unwrap();
    let out = ok(
        Command::new(repo().join("scripts/package.sh"))
            .arg(dir)
            .env("SLUICE_BIN_DIR", bin),
        180,
    );
    PathBuf::from(out.stdout.lines().last().unwrap().trim())
}

/// The options (`-x`, `--long`) a help text names.
fn options_in(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || "[]|,=(){}".contains(c))
        .filter(|w| {
            let body = w.trim_start_matches('-');
            w.starts_with('-')
                && !body.is_empty()
                && body.len() + 2 >= w.len()
                && body.chars().next().unwrap().is_ascii_alphabetic()
                && body.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
        .map(str::to_string)
        .collect()
}

/// `man -l PAGE` as plain text (piped: man-db drops the bold and underline), wide lines.
fn rendered(page: &Path) -> String {
    let out = ok(
        Command::new("man")
            .args(["-l", "-E", "UTF-8"])
            .arg(page)
            .env("MANWIDTH", "200")
            .env("MANPAGER", "cat")
            .env_remove("MAN_KEEP_FORMATTING"),
        30,
    );
    // Undo the hyphen and quote glyphs groff may substitute.
    out.stdout.replace(['\u{2010}', '\u{2212}'], "-")
}

#[test]
fn the_package_installs_checks_clean_and_documents_every_option() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let deb = build(dir.path());

    // Control fields.
    let info = ok(Command::new("dpkg-deb").arg("-I").arg(&deb), 30).stdout;
    for field in [
        "Package: sluice",
        "Version: 0.",
        "Section: net",
        "Maintainer: ",
    ] {
        assert!(info.contains(field), "no {field:?} in:\n{info}");
    }
    let depends = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .unwrap_or_else(|| panic!("no Depends:\n{info}"));
    for dep in ["libc6", "librte-eal", "librte-ethdev", "dpdk"] {
        assert!(depends.contains(dep), "Depends lacks {dep}: {depends}");
    }
    let conffiles = ok(
        Command::new("dpkg-deb")
            .arg("-I")
            .arg(&deb)
            .arg("conffiles"),
        30,
    );
    assert_eq!(conffiles.stdout.trim(), "/etc/sluice/sluice.toml");

    // Installed into a scratch root, by dpkg itself.
    let root = dir.path().join("root");
    let db = root.join("var/lib/dpkg");
    std::fs::create_dir_all(db.join("info")).unwrap();
    std::fs::create_dir_all(db.join("updates")).unwrap();
    std::fs::write(db.join("status"), "").unwrap();
    let dpkg = |args: &[&str]| {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()))
            .args([
                "--force-depends",
                "--force-script-chrootless",
                "--log=/dev/null",
            ])
            .args(args);
        c
    };
    ok(dpkg(&["-i"]).arg(&deb), 120);
    for (file, mode) in [
        ("usr/sbin/sluice", 0o755),
        ("usr/bin/sluicectl", 0o755),
        ("etc/sluice/sluice.toml", 0o640),
        ("lib/systemd/system/sluice.service", 0o644),
        ("usr/share/man/man8/sluice.8.gz", 0o644),
        ("usr/share/man/man8/sluicectl.8.gz", 0o644),
        ("usr/share/man/man5/sluice.toml.5.gz", 0o644),
        ("usr/share/bash-completion/completions/sluicectl", 0o644),
        ("usr/share/doc/sluice/copyright", 0o644),
        ("usr/share/doc/sluice/examples/loopback.toml", 0o644),
    ] {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(root.join(file))
            .unwrap_or_else(|e| panic!("{file} not installed: {e}"));
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{file}");
    }
    // No ipvsadm name on PATH unless asked for; the opt-in link is shipped outside
    // PATH, and called by it sluicectl speaks as ipvsadm 1.31 (`-h` starts with
    // 1.31's version line, `ipvsadm v1.31 2019/12/24 (compiled with ...`).
    for dir in ["usr/sbin", "usr/bin", "sbin", "bin", "usr/local/sbin"] {
        assert!(!root.join(dir).join("ipvsadm").exists(), "{dir}/ipvsadm");
    }
    let link = root.join("usr/lib/sluice/ipvsadm");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("../../bin/sluicectl")
    );
    let help = ok(Command::new(&link).arg("-h"), 10).stdout;
    assert!(
        help.starts_with("ipvsadm v1.31 2019/12/24 (compiled with "),
        "{help}"
    );
    // The installed daemon runs and accepts the installed config file.
    let installed = root.join("usr/sbin/sluice");
    let out = ok(
        Command::new(&installed)
            .arg("--check-config")
            .arg(root.join("etc/sluice/sluice.toml"))
            .arg("--file-only"),
        10,
    );
    assert!(
        out.stdout.contains("configuration valid"),
        "{}",
        out.describe()
    );

    // The conffile is dpkg's, and a local edit survives a reinstall.
    let status = ok(
        Command::new("dpkg-query")
            .arg(format!("--root={}", root.display()))
            .args(["-W", "-f=${Conffiles}", "sluice"]),
        10,
    );
    assert!(
        status.stdout.contains("/etc/sluice/sluice.toml"),
        "{}",
        status.describe()
    );
    let conf = root.join("etc/sluice/sluice.toml");
    let edited = std::fs::read_to_string(&conf).unwrap() + "# edited here\n";
    std::fs::write(&conf, &edited).unwrap();
    ok(dpkg(&["--force-confold", "-i"]).arg(&deb), 120);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), edited);

    // lintian: no error or warning (overrides, if any, are explained in
    // docs/DEPLOYMENT.md).
    let lint = run_bounded(
        Command::new("lintian")
            .args(["--fail-on", "error,warning"])
            .arg(&deb),
        Duration::from_secs(180),
    );
    let tags: Vec<&str> = lint
        .stdout
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        lint.success() && tags.is_empty(),
        "lintian: {}",
        lint.describe()
    );

    // Man pages: they render, and list every option --help lists (sluice's
    // `simulate` subcommand has its own).
    let man = root.join("usr/share/man");
    for (page, binary, args) in [
        ("man8/sluice.8.gz", SLUICE, &["--help"][..]),
        ("man8/sluice.8.gz", SLUICE, &["simulate", "--help"][..]),
        ("man8/sluicectl.8.gz", SLUICECTL, &["--help"][..]),
    ] {
        let text = rendered(&man.join(page));
        let help = ok(Command::new(binary).args(args), 10).stdout;
        let options = options_in(&help);
        assert!(options.len() > 5, "{binary}: options {options:?}");
        let missing: Vec<&String> = options.iter().filter(|o| !text.contains(*o)).collect();
        assert!(missing.is_empty(), "{page} lacks {missing:?}:\n{text}");
    }
    let toml5 = rendered(&man.join("man5/sluice.toml.5.gz"));
    let config_md = std::fs::read_to_string(repo().join("docs/CONFIG.md")).unwrap();
    let keys: Vec<&str> = config_md
        .lines()
        .filter_map(|l| l.strip_prefix("### `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert!(keys.len() > 30, "{keys:?}");
    let missing: Vec<&&str> = keys.iter().filter(|k| !toml5.contains(**k)).collect();
    assert!(missing.is_empty(), "sluice.toml(5) lacks {missing:?}");

    // The unit, as systemd reads it; its commands pointed at the scratch root (verify
    // checks that they exist; its --root mode wants a whole system).
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/sluice.service"))
        .unwrap()
        .replace(
            "/usr/sbin/sluice",
            &root.join("usr/sbin/sluice").display().to_string(),
        )
        .replace(
            "/usr/bin/sluicectl",
            &root.join("usr/bin/sluicectl").display().to_string(),
        );
    let unit_dir = dir.path().join("unit");
    std::fs::create_dir_all(&unit_dir).unwrap();
    std::fs::write(unit_dir.join("sluice.service"), unit).unwrap();
    let verify = run_bounded(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(unit_dir.join("sluice.service")),
        Duration::from_secs(60),
    );
    // verify exits 0 on an unknown key or value: its warnings are on stderr.
    assert!(
        verify.success() && verify.stderr.trim().is_empty(),
        "systemd-analyze verify: {}",
        verify.describe()
    );

    // Bash completion: --help's commands and options, read from the binary.
    let script = format!(
        "source {}; COMP_WORDS=({SLUICECTL} re); COMP_CWORD=1; _sluicectl; echo \"${{COMPREPLY[*]}}\"; \
         COMP_WORDS=({SLUICECTL} --so); _sluicectl; echo \"${{COMPREPLY[*]}}\"",
        root.join("usr/share/bash-completion/completions/sluicectl")
            .display()
    );
    let out = ok(Command::new("bash").args(["-c", &script]), 10);
    assert_eq!(out.stdout, "reload\n--socket\n", "{}", out.describe());
}

#[test]
fn help_options_are_found_in_a_help_text() {
    let found =
        options_in("  -S, --socket PATH  x\n  [-t|-u VIP:port] --rate-limit N --set=1 -- -1");
    let want: BTreeSet<String> = ["-S", "--socket", "-t", "-u", "--rate-limit", "--set"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
}
