//! Peak memory of the validation suite's run of a job ([`simulate_iteration_times`]: iteration
//! times and throughput alone) against the size of its graph, measured as `whole.rs` measures
//! a whole simulation, on the same job (`megatron-sc21-table2/ptdp-530b-560` with an eighth of
//! its micro-batches).
//!
//! The run keeps the ends of each iteration's last ops, not the start and end of every op
//! (16 bytes per op), skips the breakdowns, the graph's dependents are built without per-op
//! scratch arrays, and the lowering appends each rank's ops as soon as they are made; the
//! graph stores each distinct op once (a 4-byte index per op) and makes no stream-predecessor
//! links (the engine asks only whether an op has one): 36.2 bytes per op here, with the fixed
//! costs, against 54.1 for the whole simulation (`whole.rs`). The bound fails if any of these
//! comes back (65.4 with 32-byte ops and the links, 74.7 with the scratch arrays and the
//! buffers too, 69.1 with the buffers alone, each measured on the tree before the change; the
//! links alone are 4 bytes per op).
//!
//! A test binary of its own: the peak RSS is per process, and a run before this one (another
//! test's) would leave its freed memory in the allocator's arenas.
//!
//! [`simulate_iteration_times`]: scenario::simulation::simulate_iteration_times

mod job;
use job::assert_peak_growth;

/// The most the peak resident set may grow per op of the graph while simulating it.
const BYTES_PER_OP: u64 = 38;

#[test]
fn iteration_times_of_a_pipeline_peak_within_their_bytes_per_op() {
    assert_peak_growth("simulating the iteration times", BYTES_PER_OP, |scenario| {
        scenario::simulation::simulate_iteration_times(scenario).unwrap().engine.ops as u64
    });
}
