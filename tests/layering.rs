//! The layer diagram in docs/ARCHITECTURE.md ("Where code lives") is the rule: every
//! top-level module of the crate sits in exactly one layer and names (`crate::...`)
//! only modules of lower layers outside its tests. This reads the diagram and every
//! source file, so a new upward import or a stale diagram fails here. (Paths are
//! written from `crate::` in this code base; `super::` stays inside a module.)
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Module name -> layer number, from the fenced block between the `layers` markers.
fn layers_from_docs() -> BTreeMap<String, u32> {
    let doc = fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    let start = doc.find("<!-- layers").expect("a <!-- layers --> marker");
    let end = doc
        .find("<!-- /layers -->")
        .expect("a <!-- /layers --> marker");
    let mut layers = BTreeMap::new();
    for line in doc[start..end].lines() {
        let Some(rest) = line.strip_prefix('L') else {
            continue;
        };
        let (num, rest) = rest.split_once(' ').expect("L<n> then modules");
        let layer: u32 = num.parse().expect("a layer number");
        // Module names come first, separated by single spaces; two spaces end them.
        let names = rest.trim_start().split("  ").next().unwrap();
        for name in names.split(' ').filter(|n| !n.is_empty()) {
            let old = layers.insert(name.to_string(), layer);
            assert!(old.is_none(), "{name} is in two layers of the diagram");
        }
    }
    layers
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its test module (from a
/// `#[cfg(test)]` that opens an inline `mod`), where fixtures may use any layer. A
/// `#[cfg(test)] mod tests;` declaration only names another file (skipped by the
/// caller); the code after it is still read.
fn code_outside_tests(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|n| n.trim()).unwrap_or("");
            if next.starts_with("mod ") && next.ends_with(';') {
                lines.next();
                continue;
            }
            if next.starts_with("mod ") {
                break;
            }
        }
        let code = match t.find("//") {
            Some(at) => &t[..at],
            None => t,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every `crate::<module>` a piece of code names.
fn named_modules(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at + "crate::".len()..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // Not an identifier that merely ends in "crate" (`mycrate::`).
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
            found.push(name);
        }
        rest = tail;
    }
    found
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let layers = layers_from_docs();
    let src = repo().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut tops = std::collections::BTreeSet::new();
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "bin" {
            continue;
        }
        tops.insert(top.clone());
        // A whole file of tests (`mod tests;` under `#[cfg(test)]`).
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(&own) = layers.get(&top) else {
            continue;
        };
        let code = code_outside_tests(&fs::read_to_string(file).unwrap());
        for used in named_modules(&code) {
            if used == top {
                continue;
            }
            match layers.get(&used) {
                Some(&layer) if layer < own => {}
                Some(&layer) => violations.push(format!(
                    "{} (layer {own}) names crate::{used} (layer {layer})",
                    rel.display()
                )),
                None => violations.push(format!(
                    "{} names crate::{used}, which the diagram does not place",
                    rel.display()
                )),
            }
        }
    }
    let placed: std::collections::BTreeSet<String> = layers.keys().cloned().collect();
    assert_eq!(
        tops, placed,
        "the diagram's modules and src/'s top-level modules differ"
    );
    violations.sort();
    violations.dedup();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_an_upward_import_and_skips_tests_and_comments() {
    let code = code_outside_tests(
        "use crate::wire::ipv4;\n// crate::daemon in a comment\nfn f() { crate::dataplane::x(); }\n#[cfg(test)]\nmod tests {\n    use crate::daemon::y;\n}\n",
    );
    assert_eq!(named_modules(&code), ["wire", "dataplane"]);
    // A test module declared in its own file does not hide the code after it.
    let code = code_outside_tests("#[cfg(test)]\nmod tests;\nuse crate::daemon::x;\n");
    assert_eq!(named_modules(&code), ["daemon"]);
    assert_eq!(
        named_modules("let a = mycrate::x; sluice::crate_like"),
        Vec::<String>::new()
    );
}
