//! Embeds the validation suite in the binary: every file under `data/` (the suite in
//! `data/validation/`, the model files its cases name as `../models/...`) and `scenarios/`
//! (the scenario files its families name as `../../scenarios/...`), as a table of
//! (path relative to the checkout, bytes) in `$OUT_DIR/embedded.rs`, so that `parasim
//! validate` works from a binary copied anywhere (src/embedded.rs).
//!
//! Also records the source revision the binary is built from as `PARASIM_REVISION`: `git
//! describe --always --dirty --abbrev=12` of the checkout (a commit hash, `-dirty` when tracked
//! files differ from it), or `unknown` without git. A sweep's fingerprint covers it, so
//! outputs of different builds are never resumed or merged together (docs/sweep.md).

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
    println!("cargo:rustc-env=PARASIM_REVISION={}", revision(&manifest));
}

/// The workspace's sources: a change to any of them may change the `-dirty` flag.
const SOURCES: [&str; 14] = [
    "src",
    "units",
    "topology",
    "sim-core",
    "workloads",
    "strategies",
    "scenario",
    "traces",
    "validation",
    "plot",
    "build.rs",
    "Cargo.toml",
    "Cargo.lock",
    "tests",
];

/// `git describe --always --dirty --abbrev=12` of the checkout, or `unknown` where git or the
/// repository is missing (a source archive). Asks cargo to run this again when HEAD, the refs,
/// the index or a source changes.
fn revision(manifest: &Path) -> String {
    let git = |args: &[&str]| -> Option<String> {
        let output = std::process::Command::new("git").arg("-C").arg(manifest).args(args).output().ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let Some(described) = git(&["describe", "--always", "--dirty", "--abbrev=12"]) else {
        return "unknown".into();
    };
    for args in [["rev-parse", "--git-dir"], ["rev-parse", "--git-common-dir"]] {
        if let Some(dir) = git(&args) {
            let dir = manifest.join(dir);
            for name in ["HEAD", "index", "refs", "packed-refs"] {
                if dir.join(name).exists() {
                    println!("cargo:rerun-if-changed={}", dir.join(name).display());
                }
            }
        }
    }
    for source in SOURCES {
        if manifest.join(source).exists() {
            println!("cargo:rerun-if-changed={source}");
        }
    }
    described
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
