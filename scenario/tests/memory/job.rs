//! What the memory guards share: the job they simulate and how they measure the resident set.

use std::path::Path;

/// Simulates [`SCENARIO`] with `run` (which returns the ops it simulated) and checks that the
/// process's peak resident set grew by at most `bytes_per_op` per op; `what` names the run in
/// the messages. Prints why and passes where `/proc/self/status` has no `VmHWM`.
pub fn assert_peak_growth(what: &str, bytes_per_op: u64, run: impl FnOnce(&scenario::Scenario) -> u64) {
    if status_bytes("VmHWM:").is_none() {
        eprintln!("no /proc/self/status VmHWM here: memory not measured");
        return;
    }
    let scenario =
        scenario::Scenario::parse(SCENARIO, Path::new("memory.toml")).expect("the memory guards' job parses");
    // Reset the peak to the current RSS (Linux 4.0+); if not permitted, the peak so far is
    // already counted, which can only make the measured growth smaller.
    let reset = fs_err::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_bytes("VmRSS:").expect("VmRSS beside VmHWM");
    let ops = run(&scenario);
    let peak = status_bytes("VmHWM:").expect("VmHWM was there before");
    let growth = peak.saturating_sub(before);
    eprintln!(
        "{what}: {ops} ops; RSS before {before}, peak {peak} (reset: {reset}); growth {growth} = {:.1} bytes per op",
        growth as f64 / ops as f64
    );
    assert!(ops > 1_000_000, "{ops} ops: the job is smaller than intended");
    assert!(
        growth <= bytes_per_op * ops,
        "{what} of {ops} ops grew the peak RSS by {growth} bytes, more than {bytes_per_op} per op"
    );
}

/// A `/proc/self/status` field in bytes.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = fs_err::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kilobytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kilobytes * 1024)
}

/// `megatron-sc21-table2/ptdp-530b-560` with an eighth of its micro-batches (global batch 280
/// instead of 2,240): about 1.6 M ops.
pub const SCENARIO: &str = r#"
[cluster]
nodes = 70
gpus-per-node = 8
device = "a100-sxm4-80gb"
intra-node = { kind = "nvswitch", bandwidth = "300 GB/s", latency = "0.7 us" }
[cluster.network]
topology = "switch"
link-bandwidth = "200 Gb/s"
link-latency = "1 us"
[workload]
model = "megatron-529.6b"
framework = "megatron-lm"
precision = "fp16"
optimizer = "adam"
recompute = "full"
global-batch = 280
micro-batch = 1
[parallelism]
tensor = 8
pipeline = 35
[simulation]
fidelity = "analytical"
"#;
