//! The nccl-tests log parser on arbitrary text: a curve or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = traces::nccl::parse_tests_output(&text, std::path::Path::new("fuzz.log"));
});
