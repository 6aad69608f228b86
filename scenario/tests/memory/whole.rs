//! Peak memory of a simulation against the size of its graph, measured as the growth of this
//! process's peak resident set (Linux `VmHWM`, reset through `/proc/self/clear_refs` where
//! allowed) while simulating a mid-size pipeline job: Megatron's 529.6B model on 560 GPUs as
//! the validation suite runs it (`megatron-sc21-table2/ptdp-530b-560`), with an eighth of its
//! micro-batches (about 1.6 M ops instead of 12.7 M).
//!
//! The graph, its timeline and the engine's state take about 80 bytes per op (84.3 measured
//! here, with the fixed costs); the breakdowns that follow the run once collected every rank's
//! intervals at the same time (103.0 bytes per op here, the validation suite's peak), and now
//! hold one rank's at a time; the lowering once buffered every rank's ops before appending
//! any (87.7 here, on the tree before it appended each rank's at once). The bound fails if
//! either comes back.
//!
//! A test binary of its own: the peak RSS is per process, and the tests of the `it` binary
//! run in parallel threads whose allocations would count too.

use std::path::Path;

mod job;
use job::{SCENARIO, status_bytes};

/// The most the peak resident set may grow per op of the graph while simulating it.
const BYTES_PER_OP: u64 = 87;

#[test]
fn a_pipeline_simulation_peaks_within_its_bytes_per_op() {
    if status_bytes("VmHWM:").is_none() {
        eprintln!("no /proc/self/status VmHWM here: memory not measured");
        return;
    }
    let scenario = scenario::Scenario::parse(SCENARIO, Path::new("memory.toml")).unwrap();
    // Reset the peak to the current RSS (Linux 4.0+); if not permitted, the peak so far is
    // already counted, which can only make the measured growth smaller.
    let reset = fs_err::write("/proc/self/clear_refs", "5").is_ok();
    let before = status_bytes("VmRSS:").unwrap();
    let outcome = scenario::simulation::simulate(&scenario).unwrap();
    let peak = status_bytes("VmHWM:").unwrap();
    let ops = outcome.graph.op_count() as u64;
    let growth = peak.saturating_sub(before);
    eprintln!(
        "{ops} ops; RSS before {before}, peak {peak} (reset: {reset}); growth {growth} = {:.1} bytes per op",
        growth as f64 / ops as f64
    );
    assert!(ops > 1_000_000, "{ops} ops: the job is smaller than intended");
    assert!(
        growth <= BYTES_PER_OP * ops,
        "simulating {ops} ops grew the peak RSS by {growth} bytes, more than {BYTES_PER_OP} per op"
    );
}
