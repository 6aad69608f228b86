//! The Kineto (PyTorch profiler) importer on arbitrary bytes, read from a file as users give it:
//! a trace or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("parasim-fuzz-kineto-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let path = dir.join("rank0.json");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = traces::kineto::import(std::slice::from_ref(&path));
    let _ = traces::load(std::slice::from_ref(&path));
});
