//! The files compiled into the binary by build.rs: everything under `data/` (the validation
//! suite of `data/validation/`, the model files its cases name) and `scenarios/` (the scenario
//! files its families name), so that `parasim validate` works from a binary copied to a machine
//! without the checkout.
//!
//! The validation library reads a suite from a folder, and cases name their files relative to
//! their family's file (`../models/...`, `../../scenarios/...`): the embedded files are written,
//! in the checkout's layout, to a fresh folder under the temporary directory for the run, and
//! that folder is removed when the run ends.

use std::path::{Path, PathBuf};

use anyhow::Context;

mod table {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// Every embedded file: (path relative to the checkout, with `/`, its bytes).
pub fn files() -> &'static [(&'static str, &'static [u8])] {
    table::FILES
}

/// A hash (FNV-1a) of every embedded file's path and bytes: the data this build reads (device
/// catalog, model zoo, profiles, scenarios, the validation suite). A sweep's fingerprint covers it.
pub fn data_hash() -> u64 {
    static HASH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| {
        let mut text = Vec::new();
        for (path, bytes) in files() {
            text.extend_from_slice(path.as_bytes());
            text.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            text.extend_from_slice(bytes);
        }
        scenario::sweep::output::fnv1a(&text)
    })
}

/// The source revision this binary was built from (`git describe --always --dirty`, or
/// `unknown`; build.rs).
pub const REVISION: &str = env!("PARASIM_REVISION");

/// The embedded files written out in the checkout's layout; the folder is removed on drop.
#[derive(Debug)]
pub struct Extracted {
    root: PathBuf,
}

impl Extracted {
    /// Writes every embedded file under a new folder of the temporary directory.
    pub fn new() -> anyhow::Result<Self> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let root = std::env::temp_dir().join(format!("parasim-embedded-{}-{nanos}", std::process::id()));
        fs_err::create_dir_all(&root)
            .context("writing the embedded validation suite to the temporary directory")?;
        // Owned from here: a failure below removes what was written.
        let extracted = Self { root };
        for (relative, bytes) in files() {
            let path = extracted.root.join(relative);
            if let Some(parent) = path.parent() {
                fs_err::create_dir_all(parent)
                    .context("writing the embedded validation suite to the temporary directory")?;
            }
            fs_err::write(&path, bytes)
                .context("writing the embedded validation suite to the temporary directory")?;
        }
        Ok(extracted)
    }

    /// The folder of `relative` (a path of the checkout, e.g. `data/validation`).
    pub fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    /// The folder everything was written under.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Extracted {
    fn drop(&mut self) {
        // Best effort: a folder left in the temporary directory harms nothing.
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
