//! Where the shared real traces are, and helpers.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `../shared/data/traces` beside the checkout; panics with a clear message if missing.
pub fn shared_traces() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/traces");
    assert!(
        path.is_dir(),
        "the real traces are missing: expected the shared data folder at {} (beside the checkout; \
         its PROVENANCE.md lists the files). These tests read them from there and never copy them.",
        path.display()
    );
    path
}

/// A file under the shared traces folder, which must exist.
pub fn shared(relative: &str) -> PathBuf {
    let path = shared_traces().join(relative);
    assert!(path.is_file(), "missing shared trace {} (see PROVENANCE.md there)", path.display());
    path
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("traces-it").join(name);
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("create a scratch directory");
    path
}

/// The 8 DLRM rank files of param's `dlrm_kineto.tar.gz`, unpacked once into the target's
/// temporary directory.
pub fn dlrm_directory() -> PathBuf {
    static UNPACKED: OnceLock<PathBuf> = OnceLock::new();
    UNPACKED
        .get_or_init(|| {
            let archive = shared("param/et_replay/tests/inputs/dlrm_kineto.tar.gz");
            let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("traces-it/dlrm");
            let _ = std::fs::remove_dir_all(&target);
            std::fs::create_dir_all(&target).expect("create the unpack directory");
            let file = fs_err::File::open(&archive).expect("open dlrm_kineto.tar.gz");
            tar::Archive::new(flate2::read::GzDecoder::new(file))
                .unpack(&target)
                .expect("unpack dlrm_kineto.tar.gz");
            let directory = target.join("dlrm_kineto");
            assert!(directory.is_dir(), "the archive has a dlrm_kineto/ folder");
            directory
        })
        .clone()
}

/// Kineto JSON written to a scratch file.
pub fn write_json(directory: &Path, name: &str, text: &str) -> PathBuf {
    let path = directory.join(name);
    fs_err::write(&path, text).expect("write a scratch trace");
    path
}
