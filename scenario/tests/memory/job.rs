//! What the memory guards share: the job they simulate and how they read the resident set.

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
