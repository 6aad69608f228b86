//! Embeds the validation suite in the binary: every file under `data/` (the suite in
//! `data/validation/`, the model files its cases name as `../models/...`) and `scenarios/`
//! (the scenario files its families name as `../../scenarios/...`), as a table of
//! (path relative to the checkout, bytes) in `$OUT_DIR/embedded.rs`, so that `parasim
//! validate` works from a binary copied anywhere (src/embedded.rs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The folders embedded, relative to the checkout.
const ROOTS: [&str; 2] = ["data", "scenarios"];

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for root in ROOTS {
        println!("cargo:rerun-if-changed={root}");
        walk(&manifest, &manifest.join(root), &mut files);
    }
    files.sort();
    let mut code =
        String::from("/// Every embedded file: (path relative to the checkout, with `/`, its bytes).\n");
    code.push_str("pub static FILES: &[(&str, &[u8])] = &[\n");
    for (relative, absolute) in &files {
        writeln!(code, "    ({relative:?}, include_bytes!({absolute:?})),").expect("writing to a String");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    fs_err::write(out.join("embedded.rs"), code).expect("writing embedded.rs");
}

/// Collects every regular file under `dir` (hidden entries skipped) as (relative path,
/// absolute path).
fn walk(manifest: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs_err::read_dir(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.')) {
            continue;
        }
        if path.is_dir() {
            walk(manifest, &path, files);
        } else if path.is_file() {
            let relative = path.strip_prefix(manifest).expect("under the checkout");
            let relative: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            files.push((relative.join("/"), path.to_string_lossy().into_owned()));
        }
    }
}
