//! Peak memory of a simulation against the size of its graph, measured as the growth of this
//! process's peak resident set (Linux `VmHWM`, reset through `/proc/self/clear_refs` where
//! allowed) while simulating a mid-size pipeline job: Megatron's 529.6B model on 560 GPUs as
//! the validation suite runs it (`megatron-sc21-table2/ptdp-530b-560`), with an eighth of its
//! micro-batches (about 1.6 M ops instead of 12.7 M).
//!
//! The graph, its timeline and the engine's state take about 50 bytes per op (54.1 measured
//! here, with the fixed costs; 84.3 before the graph stored each distinct op once); the
//! breakdowns that follow the run once collected every rank's intervals at the same time
//! (19 bytes per op more, the validation suite's peak then), and now hold one rank's at a
//! time; the lowering once buffered every rank's ops before appending any (3.4 bytes per op
//! more, each measured on the tree before its change). The bound fails if any of these comes
//! back.
//!
//! A test binary of its own: the peak RSS is per process, and the tests of the `it` binary
//! run in parallel threads whose allocations would count too.

mod job;
use job::assert_peak_growth;

/// The most the peak resident set may grow per op of the graph while simulating it.
const BYTES_PER_OP: u64 = 57;

#[test]
fn a_pipeline_simulation_peaks_within_its_bytes_per_op() {
    assert_peak_growth("simulating", BYTES_PER_OP, |scenario| {
        scenario::simulation::simulate(scenario).unwrap().graph.op_count() as u64
    });
}
