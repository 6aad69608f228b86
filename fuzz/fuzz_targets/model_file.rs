//! The layer-by-layer model-file parser on arbitrary text: a model or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = workloads::Model::from_toml_str(text, "models/fuzz.toml");
});
