//! The scenario parser on arbitrary text: a value or an error naming the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(error) = scenario::Scenario::parse(text, std::path::Path::new("fuzz.toml")) {
        assert!(error.to_string().contains("fuzz.toml"), "{error}");
    }
});
