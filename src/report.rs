//! Human-readable printing of a run's summary.

use sim_core::units::{Bytes, SimDuration};
use std::fmt::Write as _;

use workloads::simulation::Outcome;

/// The summary as the text `parasim run` prints.
pub fn human(outcome: &Outcome) -> String {
    let summary = &outcome.summary;
    let mut out = String::new();
    let s = summary;
    let m = &s.model;
    let c = &s.cluster;
    let share =
        |d: SimDuration| 100.0 * d.as_secs_f64() / s.iteration_time.as_secs_f64().max(f64::MIN_POSITIVE);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "scenario      {}", s.scenario);
    let _ = writeln!(
        out,
        "model         {} ({} parameters, {}MAC per sample), batch {} per GPU, {} (gradients {}), {}",
        m.name,
        crate::models::si(m.parameters as f64),
        crate::models::si_unit(m.macs_per_sample),
        m.batch_per_device,
        m.precision,
        m.gradient_precision,
        m.optimizer
    );
    let _ = writeln!(
        out,
        "cluster       {} x {} = {} nodes x {} GPUs",
        c.gpus, c.device, c.nodes, c.gpus_per_node
    );
    let _ = writeln!(out, "              intra-node {}; network {}", c.intra_node, c.network);
    let _ = writeln!(
        out,
        "strategy      data parallel x{}: {} gradient buckets, {} per iteration, {} allreduce",
        s.strategy.data_parallel,
        s.strategy.gradient_buckets,
        Bytes(s.strategy.gradient_bytes),
        s.strategy.allreduce
    );
    let _ = writeln!(out, "network model {}", s.fidelity);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "iteration     {:.3}  (mean of {} iteration{})",
        s.iteration_time,
        s.iterations,
        if s.iterations == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "throughput    {} samples/s ({} per GPU)",
        thousands(s.samples_per_second),
        thousands(s.samples_per_second_per_device)
    );
    let _ = writeln!(
        out,
        "compute       {:.1} TFLOP/s per GPU achieved, MFU {:.1}% of {:.0} TFLOP/s {}",
        s.achieved_tflops_per_device,
        100.0 * s.mfu,
        s.peak_tflops_per_device,
        m.precision
    );
    let _ = writeln!(out, "compute model {}", m.compute_model);
    let _ = writeln!(out);
    let b = &s.breakdown;
    let _ = writeln!(out, "per iteration, mean over GPUs");
    let _ = writeln!(out, "  compute               {:>12.3}  {:5.1}%", b.compute, share(b.compute));
    let _ = writeln!(
        out,
        "  exposed communication {:>12.3}  {:5.1}%",
        b.exposed_communication,
        share(b.exposed_communication)
    );
    let _ = writeln!(out, "  idle                  {:>12.3}  {:5.1}%", b.idle, share(b.idle));
    let hidden = b.communication.saturating_sub(b.exposed_communication);
    let hidden_share = if b.communication > SimDuration::ZERO {
        100.0 * hidden.as_secs_f64() / b.communication.as_secs_f64()
    } else {
        0.0
    };
    let _ = writeln!(
        out,
        "  communication total   {:>12.3}  ({hidden_share:.0}% hidden behind compute)",
        b.communication
    );
    let _ = writeln!(out);
    let memory = &s.memory;
    let gb = |bytes: u64| workloads::memory::gigabytes(Bytes(bytes));
    let _ = writeln!(
        out,
        "memory        {} per GPU of {} ({}), {:.0}%; recomputation {}",
        gb(memory.total),
        gb(memory.capacity),
        Bytes(memory.capacity),
        100.0 * memory.total as f64 / memory.capacity.max(1) as f64,
        memory.recompute
    );
    for (name, bytes) in [
        ("weights", memory.weights),
        ("gradients", memory.gradients),
        ("optimizer state", memory.optimizer),
        ("activations", memory.activations),
        ("temporary buffers", memory.temporary),
        ("communication buffers", memory.communication),
    ] {
        let _ = writeln!(out, "  {name:<22} {:>12}", gb(bytes));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", engine_line(outcome));
    out
}

/// "engine  26,048 ops, 25,733 events; lowering 2.1 ms, simulation 2.0 ms (12.9 M events/s)".
pub fn engine_line(outcome: &Outcome) -> String {
    let engine = &outcome.summary.engine;
    let simulation = outcome.simulation_wall.as_secs_f64();
    format!(
        "engine        {} ops, {} events; lowering {:.1} ms, simulation {:.1} ms ({:.1} M events/s)",
        thousands(engine.ops as f64),
        thousands(engine.events as f64),
        outcome.lowering_wall.as_secs_f64() * 1e3,
        simulation * 1e3,
        engine.events as f64 / simulation.max(1e-9) / 1e6
    )
}

/// 12345.6 -> "12,346".
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
