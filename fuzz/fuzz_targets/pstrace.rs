//! The compact binary trace decoder (`.pstrace`) on arbitrary bytes: a trace or an error naming
//! the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(error) = traces::binary::from_bytes(data, std::path::Path::new("fuzz.pstrace")) {
        assert!(error.to_string().contains("fuzz.pstrace"), "{error}");
    }
});
