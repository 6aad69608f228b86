//! Human-readable printing of a run's summary.

use sim_core::units::{Bytes, SimDuration};
use std::fmt::Write as _;

use scenario::simulation::{Outcome, Summary};

/// The summary as the text `parasim run` prints: one section after another.
pub fn human(outcome: &Outcome) -> String {
    let mut report = Report::new(&outcome.summary);
    report.setup();
    if report.data_parallel_only {
        report.data_parallel_strategy();
    } else {
        report.hybrid_strategy();
    }
    report.input();
    report.framework();
    report.host();
    report.network();
    report.results();
    report.distribution();
    report.breakdown();
    report.memory();
    report.goodput();
    let mut out = report.out;
    // Writing to a String cannot fail.
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", engine_line(outcome));
    out
}

/// The text being written, and what every section needs to know about the run.
struct Report<'s> {
    summary: &'s Summary,
    /// "GPU" or "CPU": what one device is called.
    unit: &'static str,
    /// Data parallelism alone: the short form of the strategy, throughput and breakdown.
    data_parallel_only: bool,
    out: String,
}

impl<'s> Report<'s> {
    fn new(s: &'s Summary) -> Report<'s> {
        let st = &s.strategy;
        let data_parallel_only = st.tensor == 1
            && st.pipeline == 1
            && st.context == 1
            && st.expert == 1
            && st.zero == 0
            && st.filter == 1
            && st.channel == 1
            && st.spatial == 1;
        Report { summary: s, unit: s.cluster.device_kind.noun(), data_parallel_only, out: String::new() }
    }

    /// The scenario, the model and its batch, the cluster.
    fn setup(&mut self) {
        let (s, unit, data_parallel_only, out) =
            (self.summary, self.unit, self.data_parallel_only, &mut self.out);
        let m = &s.model;
        let c = &s.cluster;
        let st = &s.strategy;
        let _ = writeln!(out, "scenario      {}", s.scenario);
        let batch = if data_parallel_only && st.micro_batches == 1 {
            format!("batch {} per {unit}", m.batch_per_device)
        } else {
            format!(
                "global batch {}, micro-batch {} ({} per replica)",
                st.global_batch, st.micro_batch, st.micro_batches
            )
        };
        let _ = writeln!(
            out,
            "model         {} ({} parameters{}, {}MAC per sample), {batch}, {} (gradients {}), {}",
            m.name,
            crate::models::si(m.parameters as f64),
            m.frozen_parameters
                .map(|frozen| format!(" trained, {} frozen", crate::models::si(frozen as f64)))
                .unwrap_or_default(),
            crate::models::si_unit(m.macs_per_sample),
            m.precision,
            m.gradient_precision,
            match &m.muon {
                Some(muon) => format!(
                    "{} ({} Newton-Schulz steps, {} iteration, {})",
                    m.optimizer, muon.steps, muon.iteration, muon.distribution
                ),
                None => m.optimizer.clone(),
            }
        );
        if m.passes.is_some() {
            let _ = writeln!(
                out,
                "passes        the forward pass alone (workload.passes = \"forward\"): no backward, gradient synchronisation or optimizer step; memory as in training"
            );
        }
        let _ = writeln!(
            out,
            "cluster       {} x {} = {} nodes x {} {unit}{}",
            c.gpus,
            c.device,
            c.nodes,
            c.gpus_per_node,
            if c.gpus_per_node == 1 { "" } else { "s" }
        );
        let _ = writeln!(out, "              intra-node {}; network {}", c.intra_node, c.network);
    }

    /// Data parallelism alone: buckets and bytes, and DASO's or out-of-core training's extras.
    fn data_parallel_strategy(&mut self) {
        let (s, unit, out) = (self.summary, self.unit, &mut self.out);
        let st = &s.strategy;
        if s.model.passes.is_some() {
            let _ = writeln!(
                out,
                "strategy      data parallel x{}: the forward alone synchronises nothing",
                st.data_parallel
            );
            return;
        }
        let _ = writeln!(
            out,
            "strategy      data parallel x{}: {} gradient buckets, {} per iteration, {} allreduce",
            st.data_parallel,
            st.gradient_buckets,
            Bytes(st.gradient_bytes),
            st.allreduce
        );
        if let Some(daso) = &st.daso {
            let wait = if daso.global_sync == "blocking" {
                String::new()
            } else {
                format!(", received {} iteration(s) later", daso.global_sync_wait)
            };
            let _ = writeln!(
                out,
                "              DASO: buckets all-reduced inside each node of {} {unit}s; every {} iterations the \
             parameters ({}) all-reduced across nodes by one {unit} per node, {}{wait}",
                daso.node_gpus,
                daso.global_sync_every,
                workloads::memory::gigabytes(Bytes(daso.global_bytes)),
                daso.global_sync
            );
        }
        self.offload_lines();
    }

    /// Out-of-core training's lines: what goes to host memory and back, and with the weights
    /// the traffic of each part.
    fn offload_lines(&mut self) {
        let (s, unit, out) = (self.summary, self.unit, &mut self.out);
        let st = &s.strategy;
        if let Some(offload) = &st.offload {
            let _ = writeln!(
                out,
                "              out-of-core: {} to host memory, {} out and {} back per iteration per {unit}; \
             host memory {} of {} per node",
                offload.offload,
                workloads::memory::gigabytes(Bytes(offload.to_host_bytes)),
                workloads::memory::gigabytes(Bytes(offload.to_device_bytes)),
                workloads::memory::gigabytes(Bytes(offload.host_memory_bytes)),
                workloads::memory::gigabytes(Bytes(offload.host_memory_capacity))
            );
            if let Some(cpu) = &offload.host_cpu {
                let parameters = offload.offload.ends_with("+parameters");
                let _ = writeln!(
                    out,
                    "              optimizer on the host CPU: gradients {} out, {} {} {}; step {:.3} s on {cpu}",
                    workloads::memory::gigabytes(Bytes(offload.gradient_bytes)),
                    if parameters { "weight shards" } else { "updated weights" },
                    workloads::memory::gigabytes(Bytes(offload.weight_bytes)),
                    if parameters { "fetched before their allgathers" } else { "back" },
                    offload.host_optimizer_step_s
                );
                if let (Some(bandwidth), Some(nvme_bytes)) =
                    (offload.nvme_bandwidth_bytes_per_s, offload.nvme_bytes)
                {
                    let read = offload.nvme_read_bytes.unwrap_or(nvme_bytes / 2);
                    let written = nvme_bytes.saturating_sub(read);
                    let _ = writeln!(
                        out,
                        "              {} on NVMe: {} read and {} written per iteration per {unit} at {:.2} GB/s \
                 (its share of the node's drives)",
                        if parameters { "optimizer state and weight shards" } else { "optimizer state" },
                        workloads::memory::gigabytes(Bytes(read)),
                        if written == read {
                            "as much".to_string()
                        } else {
                            workloads::memory::gigabytes(Bytes(written))
                        },
                        bandwidth / 1e9
                    );
                }
            } else if offload.weight_bytes > 0 {
                let _ = writeln!(
                    out,
                    "              out-of-core weights: activations {} each way, weights {} prefetched, \
                 gradients {} out, optimizer step {} in and {} out",
                    workloads::memory::gigabytes(Bytes(offload.activation_bytes)),
                    workloads::memory::gigabytes(Bytes(offload.weight_bytes)),
                    workloads::memory::gigabytes(Bytes(offload.gradient_bytes)),
                    workloads::memory::gigabytes(Bytes(offload.optimizer_to_device_bytes)),
                    workloads::memory::gigabytes(Bytes(offload.optimizer_to_host_bytes))
                );
            }
        }
    }

    /// Every degree above 1, ZeRO, the rank order and the data-parallel collectives.
    fn hybrid_strategy(&mut self) {
        let (s, unit, out) = (self.summary, self.unit, &mut self.out);
        let st = &s.strategy;
        let mut degrees = vec![format!("data {}", st.data_parallel)];
        if st.tensor > 1 {
            degrees.push(format!(
                "tensor {}{}",
                st.tensor,
                if st.sequence_parallel { " (sequence parallel)" } else { "" }
            ));
        }
        if st.pipeline > 1 {
            let virtual_stages = if st.virtual_stages > 1 {
                format!(", {} chunks per stage", st.virtual_stages)
            } else {
                String::new()
            };
            let sync =
                if st.pipeline_host_sync.is_some() { ", host synchronises at each exchange" } else { "" };
            degrees.push(format!("pipeline {} ({}{virtual_stages}{sync})", st.pipeline, st.schedule));
        }
        if st.context > 1 {
            degrees.push(format!("context {}", st.context));
        }
        if st.expert > 1 {
            degrees.push(format!("expert {}", st.expert));
        }
        if st.filter > 1 {
            degrees.push(format!("filter {}", st.filter));
        }
        if st.channel > 1 {
            degrees.push(format!("channel {}", st.channel));
        }
        if st.spatial > 1 {
            degrees.push(format!("spatial {} ({})", st.spatial, st.spatial_dims.unwrap_or("h")));
        }
        let zero = match (st.zero, st.zero_implementation) {
            (0, _) => String::new(),
            (stage, Some(software)) => format!(", ZeRO-{stage} ({software})"),
            (stage, None) => format!(", ZeRO-{stage}"),
        };
        let _ = writeln!(out, "strategy      {}{zero}; ranks ordered {}", degrees.join(" x "), st.order);
        let _ = writeln!(
            out,
            "              {} {}, {} per stage-0 {unit}, {} data-parallel collectives",
            st.gradient_buckets,
            match (st.zero, st.zero_implementation) {
                (3.., Some(_)) => "fp16 gradient buckets all-reduced (parameters gathered one by one)",
                (3.., None) => "units gathered and scattered whole (FSDP)",
                _ => "gradient buckets",
            },
            workloads::memory::gigabytes(Bytes(st.gradient_bytes)),
            st.allreduce
        );
        self.offload_lines();
    }

    /// The data loader and the input copy, when the scenario models them.
    fn input(&mut self) {
        let (s, out) = (self.summary, &mut self.out);
        let st = &s.strategy;
        if let Some(input) = &st.input {
            let broadcast = if input.broadcast_bytes > 0 {
                let rate = input
                    .broadcast_rate
                    .map_or(String::new(), |rate| format!(", serialised at {:.2} GB/s", rate / 1e9));
                format!(
                    "; the batch ({}) broadcast to the group{rate}",
                    workloads::memory::gigabytes(Bytes(input.broadcast_bytes))
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "input         {} loader: {} samples per iteration at {} samples/s, {} batch(es) ahead{broadcast}",
                input.loader, input.samples_per_loader, input.rate, input.prefetch
            );
        }
        if let Some(bytes) = st.input_copy_bytes {
            let _ = writeln!(
                out,
                "input copy    {:.1} MB per iteration to each first-stage GPU over its host link, on the compute stream",
                bytes as f64 / 1e6
            );
        }
    }

    /// The training framework and the settings it implied: what was assumed for the user.
    fn framework(&mut self) {
        let (s, out) = (self.summary, &mut self.out);
        let Some(framework) = &s.framework else { return };
        let _ = writeln!(out, "framework     {} ({})", framework.name, framework.title);
        for setting in &framework.implied {
            let _ = writeln!(out, "              implies {} = {}", setting.key, setting.value);
        }
        for setting in &framework.explicit {
            let _ = writeln!(
                out,
                "              {}: the scenario's own value (the framework's: {})",
                setting.key, setting.value
            );
        }
        for setting in &framework.not_applied {
            let reason = setting.reason.as_deref().unwrap_or_default();
            let _ =
                writeln!(out, "              {} = {} does not apply: {reason}", setting.key, setting.value);
        }
    }

    /// The host and execution mode, and the per-op dispatch cost they gave.
    fn host(&mut self) {
        let (s, out) = (self.summary, &mut self.out);
        let Some(host) = &s.host else { return };
        let name = match (&host.host, &host.title) {
            (Some(name), Some(title)) => format!("{name} ({title}), "),
            _ => String::new(),
        };
        let _ = writeln!(out, "host          {name}{} execution", host.execution);
        match &host.dispatch {
            Some(cost) => {
                let _ = writeln!(
                    out,
                    "              implies compute.dispatch-overhead = compute.op-dispatch-overhead = {cost:?} per kernel launch, measured: {}",
                    host.source
                );
            }
            None => {
                let _ = writeln!(out, "              {}", host.source);
            }
        }
    }

    /// The network model and how protocols are chosen.
    fn network(&mut self) {
        let (s, out) = (self.summary, &mut self.out);
        let protocols = match s.protocol.as_str() {
            "off" => "collectives on the links alone (protocol off)".to_string(),
            "auto" => "NCCL protocols chosen by its tuner (protocol auto)".to_string(),
            one => format!("NCCL protocol {one}"),
        };
        let _ = writeln!(out, "network model {}; {protocols}", s.fidelity);
        for (index, line) in s.link_conditions.iter().enumerate() {
            let label = if index == 0 { "link faults" } else { "" };
            let _ = writeln!(out, "{label:<14}{line}");
        }
        let _ = writeln!(out);
    }

    /// Iteration time, throughput, achieved FLOP/s and MFU.
    fn results(&mut self) {
        let (s, unit, data_parallel_only, out) =
            (self.summary, self.unit, self.data_parallel_only, &mut self.out);
        let m = &s.model;
        let c = &s.cluster;
        let _ = writeln!(
            out,
            "iteration     {:.3}  (mean of {} iteration{})",
            s.iteration_time,
            s.iterations,
            if s.iterations == 1 { "" } else { "s" }
        );
        match s.tokens_per_second {
            Some(tokens) if !data_parallel_only => {
                let _ = writeln!(
                    out,
                    "throughput    {:.2} samples/s, {} tokens/s ({} per {unit})",
                    s.samples_per_second,
                    thousands(tokens),
                    thousands(tokens / f64::from(c.gpus))
                );
            }
            // A sequence model's tokens/s beside its samples/s, as LLM users count.
            Some(tokens) => {
                let _ = writeln!(
                    out,
                    "throughput    {} samples/s ({} per {unit}), {} tokens/s ({} per {unit})",
                    thousands(s.samples_per_second),
                    thousands(s.samples_per_second_per_device),
                    thousands(tokens),
                    thousands(tokens / f64::from(c.gpus))
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "throughput    {} samples/s ({} per {unit})",
                    thousands(s.samples_per_second),
                    thousands(s.samples_per_second_per_device)
                );
            }
        }
        let _ = writeln!(
            out,
            "compute       {:.1} TFLOP/s per {unit} achieved, MFU {:.1}% of {:.0} TFLOP/s {}",
            s.achieved_tflops_per_device,
            100.0 * s.mfu,
            s.peak_tflops_per_device,
            m.precision
        );
        if !data_parallel_only {
            let _ = writeln!(
                out,
                "              model FLOPs utilization {:.1}% (6 x MACs x samples), hardware {:.1}% (recomputation included)",
                100.0 * s.model_flops_utilization,
                100.0 * s.hardware_flops_utilization
            );
        }
        if !s.devices.is_empty() {
            // Means over several device types: each type's own, from the same run.
            let _ = writeln!(out, "              (mean peak of the cluster's {unit}s)");
            for d in &s.devices {
                let _ = writeln!(
                    out,
                    "  {:<26} {:>5} {unit}s  busy {:5.1}%  {:6.1} TFLOP/s achieved, MFU {:.1}% of {:.0} TFLOP/s",
                    d.device,
                    d.gpus,
                    100.0 * d.busy,
                    d.achieved_tflops_per_device,
                    100.0 * d.mfu,
                    d.peak_tflops_per_device
                );
            }
        }
        let _ = writeln!(out, "compute model {}", m.compute_model);
        let _ = writeln!(out);
    }

    /// A Monte Carlo run's variability, iteration-time distribution and critical ranks.
    fn distribution(&mut self) {
        let (s, unit, out) = (self.summary, self.unit, &mut self.out);
        let Some(d) = &s.distribution else { return };
        let ms = |seconds: f64| SimDuration::from_ps((seconds * 1e12).round() as u64);
        for (index, source) in d.sources.iter().enumerate() {
            let _ = writeln!(out, "{}{source}", if index == 0 { "variability   " } else { "              " });
        }
        let _ = writeln!(
            out,
            "distribution  {} iterations (seed {}): mean {:.3} ({:+.2}% over noise-free {:.3}), stdev {:.3}",
            thousands(f64::from(d.iterations)),
            d.seed,
            ms(d.mean_s),
            100.0 * (d.slowdown - 1.0),
            ms(d.nominal_s),
            ms(d.stdev_s)
        );
        let _ = writeln!(
            out,
            "              min {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
            ms(d.min_s),
            ms(d.p50_s),
            ms(d.p90_s),
            ms(d.p99_s),
            ms(d.max_s)
        );
        if d.critical_ranks.is_empty() {
            let _ = writeln!(out, "critical path no {unit} compute on it (communication-bound)");
        } else {
            let ranks: Vec<String> = d
                .critical_ranks
                .iter()
                .take(5)
                .map(|r| format!("rank {} {:.0}%", r.rank, 100.0 * r.share))
                .collect();
            let _ = writeln!(
                out,
                "critical path {} (share of {} repetitions of the {}-iteration graph)",
                ranks.join(", "),
                thousands(f64::from(d.repetitions)),
                d.graph_iterations
            );
        }
        let _ = writeln!(out, "              communication timed {}", d.communication);
        let _ = writeln!(out);
    }

    /// Where the iteration goes: compute, exposed communication by group, idle and its causes.
    fn breakdown(&mut self) {
        let (s, unit, data_parallel_only, out) =
            (self.summary, self.unit, self.data_parallel_only, &mut self.out);
        let st = &s.strategy;
        // Percent of the iteration that `d` is.
        // A Monte Carlo run's breakdown is its noise-free iteration's.
        let nominal = s.distribution.as_ref().map(|d| d.nominal_s);
        let iteration = nominal.unwrap_or(s.iteration_time.as_secs_f64()).max(f64::MIN_POSITIVE);
        let share = |d: SimDuration| 100.0 * d.as_secs_f64() / iteration;
        let b = &s.breakdown;
        if nominal.is_some() {
            let _ = writeln!(out, "per noise-free iteration, mean over {unit}s");
        } else {
            let _ = writeln!(out, "per iteration, mean over {unit}s");
        }
        let _ = writeln!(out, "  compute               {:>12.3}  {:5.1}%", b.compute, share(b.compute));
        let _ = writeln!(
            out,
            "  exposed communication {:>12.3}  {:5.1}%",
            b.exposed_communication,
            share(b.exposed_communication)
        );
        if !data_parallel_only {
            let groups = &b.exposed_by_group;
            for (name, seconds) in [
                ("tensor", groups.tensor),
                ("pipeline", groups.pipeline),
                ("data", groups.data),
                ("context", groups.context),
                ("expert", groups.expert),
                ("filter", groups.filter),
                ("channel", groups.channel),
                ("spatial", groups.spatial),
            ] {
                if seconds > 0.0 {
                    let d = SimDuration::from_secs_f64(seconds).unwrap_or(SimDuration::ZERO);
                    let _ = writeln!(out, "    {name:<20}{:>12.3}  {:5.1}%", d, share(d));
                }
            }
        }
        if b.offload_stall > SimDuration::ZERO {
            let _ = writeln!(
                out,
                "    offload stall       {:>12.3}  {:5.1}%  (copies to or from host memory, no kernel running)",
                b.offload_stall,
                share(b.offload_stall)
            );
        }
        if st.pipeline > 1 {
            let _ = writeln!(out, "  pipeline bubble       {:>12.3}  {:5.1}%", b.bubble, share(b.bubble));
            let rest = b.idle.saturating_sub(b.bubble);
            let _ = writeln!(out, "  other idle            {:>12.3}  {:5.1}%", rest, share(rest));
        } else {
            let _ = writeln!(out, "  idle                  {:>12.3}  {:5.1}%", b.idle, share(b.idle));
        }
        // Parts of idle with a cause: (label padded to the column, time, shown, why).
        for (label, time, shown, why) in [
            (
                "host-bound ",
                b.host_bound,
                share(b.host_bound) >= 0.05,
                format!("the {unit} waiting for kernel launches"),
            ),
            (
                "input-bound",
                b.input_bound,
                b.input_bound > SimDuration::ZERO,
                format!("the {unit} waiting for its batch: loader, broadcast"),
            ),
        ] {
            if shown {
                let _ = writeln!(out, "    of which {label}{:>10.3}  {:5.1}%  ({why})", time, share(time));
            }
        }
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
    }

    /// Memory per device by kind, and per pipeline stage.
    fn memory(&mut self) {
        let (s, unit, out) = (self.summary, self.unit, &mut self.out);
        let memory = &s.memory;
        let gb = |bytes: u64| workloads::memory::gigabytes(Bytes(bytes));
        let margin = workloads::memory::Margin::new(Bytes(memory.total), Bytes(memory.capacity));
        let _ = writeln!(out, "memory        per {unit} {margin}; recomputation {}", memory.recompute);
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
        if s.stages.len() > 1 {
            let _ = writeln!(
                out,
                "  per stage: {:>5} {:>8} {:>10} {:>9} {:>10} {:>9}",
                "stage", "blocks", "params", "in flight", "activations", "total"
            );
            for stage in &s.stages {
                let _ = writeln!(
                    out,
                    "             {:>5} {:>8} {:>10} {:>9.1} {:>11} {:>9}",
                    stage.stage,
                    stage.blocks,
                    crate::models::si(stage.parameters as f64),
                    stage.peak_micro_batches_in_flight,
                    gb(stage.memory.activations),
                    gb(stage.memory.total)
                );
            }
        }
    }
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
    ) + &outcome
        .monte_carlo_wall
        .map(|wall| {
            format!(
                "\nmonte carlo   {} iterations re-timed in {:.1} ms",
                thousands(f64::from(outcome.summary.iterations)),
                wall.as_secs_f64() * 1e3
            )
        })
        .unwrap_or_default()
}

/// 12345.6 -> "12,346".
fn thousands(value: f64) -> String {
    sim_core::units::thousands(value.max(0.0).round() as u64)
}

impl Report<'_> {
    /// Goodput under `[failures]`: where the wall-clock budget went for this run's draw of
    /// failures, the expected goodput and the checkpoint interval that maximises it.
    fn goodput(&mut self) {
        let Some(g) = &self.summary.goodput else { return };
        let out = &mut self.out;
        let hours = |h: f64| if h < 1.0 { format!("{:.1} min", h * 60.0) } else { format!("{h:.2} h") };
        let share = |h: f64| 100.0 * h / g.hours;
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "goodput       {:.1}% of {} wall time ({}, seed {}): {} failures (gpu {}, node {}, link {})",
            100.0 * g.fraction,
            hours(g.hours),
            g.response,
            g.seed,
            g.failures.gpu + g.failures.node + g.failures.link,
            g.failures.gpu,
            g.failures.node,
            g.failures.link
        );
        let _ = writeln!(
            out,
            "  checkpoint  {} every {} iterations ({}), written in {:.1} s; recovery {:.1} min",
            if g.checkpoint_bytes >= 1_000_000_000_000 {
                format!("{:.2} TB", g.checkpoint_bytes as f64 / 1e12)
            } else {
                format!("{:.2} GB", g.checkpoint_bytes as f64 / 1e9)
            },
            g.checkpoint_interval_iterations,
            hours(g.checkpoint_interval_iterations as f64 * g.step_time_s / 3600.0),
            g.checkpoint_write_s,
            g.recovery_s / 60.0
        );
        let _ = writeln!(
            out,
            "  time        useful {} ({:.1}%), checkpoint writes {} ({:.1}%), lost work {} ({:.1}%), restarts {} ({:.1}%)",
            hours(g.useful_hours),
            share(g.useful_hours),
            hours(g.lost_hours_checkpoint),
            share(g.lost_hours_checkpoint),
            hours(g.lost_hours_lost_work),
            share(g.lost_hours_lost_work),
            hours(g.lost_hours_restart),
            share(g.lost_hours_restart)
        );
        if let Some(mtbf) = g.job_mtbf_hours {
            let _ = writeln!(
                out,
                "  expected    {:.2}% over {} draws (first order 1 - C/T - T/2M - R/M: {:.2}%), job MTBF {}",
                100.0 * g.expected_fraction,
                g.replicas,
                100.0 * g.first_order_goodput.unwrap_or(0.0),
                hours(mtbf)
            );
        }
        let _ = writeln!(
            out,
            "  best        every {} iterations ({}): {:.2}% expected{}",
            g.best_interval.iterations,
            hours(g.best_interval.hours),
            100.0 * g.best_interval.goodput,
            g.young_interval_iterations
                .map_or(String::new(), |young| format!(" (Young's sqrt(2 C M): {young:.0} iterations)"))
        );
    }
}

/// The report of several jobs on one fabric (`[[jobs]]`): the fabric, each job's time alone
/// and shared and its slowdown, the links two jobs or more shared, and the engine line.
pub fn jobs_human(outcome: &scenario::jobs::JobsOutcome) -> String {
    let summary = &outcome.summary;
    let mut out = String::new();
    let _ = writeln!(out, "scenario      {}", summary.scenario);
    let _ = writeln!(
        out,
        "fabric        {} GPUs = {} nodes x {}; network {}",
        thousands(f64::from(summary.gpus)),
        summary.nodes,
        summary.gpus_per_node,
        summary.network
    );
    let seed = if summary.placement == scenario::Placement::Random {
        format!(" (seed {})", summary.placement_seed)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "placement     {}{seed}; network model {}; each job also run alone on the same GPUs",
        summary.placement.name(),
        summary.fidelity
    );
    let _ = writeln!(out);
    let name_width = summary.jobs.iter().map(|job| job.name.len()).max().unwrap_or(3).max(3);
    let _ = writeln!(
        out,
        "{:<name_width$}  {:>6}  {:>5}  {:>10}  {:>12}  {:>12}  {:>8}  model, strategy",
        "job", "GPUs", "nodes", "start", "alone", "shared", "slowdown"
    );
    for job in &summary.jobs {
        let _ = writeln!(
            out,
            "{:<name_width$}  {:>6}  {:>5}  {:>10}  {:>12}  {:>12}  {:>7.3}x  {}, {}",
            job.name,
            thousands(f64::from(job.gpus)),
            job.node_list.len(),
            seconds_text(job.start_s),
            seconds_text(job.alone_s),
            seconds_text(job.shared_s),
            job.slowdown,
            job.model,
            job.strategy
        );
    }
    let _ = writeln!(out, "(alone, shared: from the job's start to the end of its last iteration)");
    let _ = writeln!(out);
    let varied: Vec<_> =
        summary.jobs.iter().filter_map(|job| job.distribution.as_ref().map(|d| (job, d))).collect();
    if let Some((_, first)) = varied.first() {
        let _ = writeln!(
            out,
            "iteration time under [variability] (each job's iterations in the shared run re-timed with fresh draws, seed {}; communication as in the shared run):",
            first.seed
        );
        let _ = writeln!(
            out,
            "{:<name_width$}  {:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>8}",
            "job", "iterations", "nominal", "mean", "p50", "p90", "p99", "max", "slowdown"
        );
        for (job, d) in varied {
            let _ = writeln!(
                out,
                "{:<name_width$}  {:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>7.3}x",
                job.name,
                d.iterations,
                seconds_text(d.nominal_s),
                seconds_text(d.mean_s),
                seconds_text(d.p50_s),
                seconds_text(d.p90_s),
                seconds_text(d.p99_s),
                seconds_text(d.max_s),
                d.slowdown
            );
        }
        let _ = writeln!(out);
    }
    let struck: Vec<_> =
        summary.jobs.iter().filter_map(|job| job.goodput.as_ref().map(|g| (job, g))).collect();
    if let Some((_, first)) = struck.first() {
        let _ = writeln!(
            out,
            "goodput under [failures] ({} h, {}; each job's GPUs, nodes and the cables its traffic crossed; step: its shared-run iteration):",
            first.hours, first.response
        );
        let _ = writeln!(
            out,
            "{:<name_width$}  {:>8}  {:>16}  {:>11}  {:>10}  {:>10}  {:>10}  {:>18}",
            "job",
            "goodput",
            "failures g/n/l",
            "checkpoint",
            "lost work",
            "restart",
            "interval",
            "best interval"
        );
        for (job, g) in struck {
            let _ = writeln!(
                out,
                "{:<name_width$}  {:>7.2}%  {:>16}  {:>9.2} h  {:>8.2} h  {:>8.2} h  {:>10}  {:>10} ({:.2}%)",
                job.name,
                100.0 * g.fraction,
                format!("{}/{}/{}", g.failures.gpu, g.failures.node, g.failures.link),
                g.lost_hours_checkpoint,
                g.lost_hours_lost_work,
                g.lost_hours_restart,
                g.checkpoint_interval_iterations,
                g.best_interval.iterations,
                100.0 * g.best_interval.goodput
            );
        }
        let _ = writeln!(out);
    }
    if summary.contended_links.is_empty() {
        let _ = writeln!(out, "contended links: none (no link carried the traffic of two jobs)");
    } else {
        let _ = writeln!(
            out,
            "contended links (carrying two jobs or more; mean utilisation over the shared run's {}):",
            seconds_text(summary.makespan_s)
        );
        for link in &summary.contended_links {
            let _ = writeln!(
                out,
                "  {:>5.1}%  {:>11}  {:<11}  {}  ({})",
                100.0 * link.link.utilisation,
                sim_core::units::Bytes(link.link.bytes.round() as u64).to_string(),
                link.link.kind,
                link.link.name,
                link.jobs.join(", ")
            );
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{}", jobs_engine_line(outcome));
    out
}

/// The engine line of a run of several jobs (stderr under `--json`).
pub fn jobs_engine_line(outcome: &scenario::jobs::JobsOutcome) -> String {
    format!(
        "engine        {} ops shared, {} events; lowering {:.1} ms, simulation {:.1} ms (shared and alone runs)",
        thousands(outcome.ops as f64),
        thousands(outcome.events as f64),
        outcome.lowering_wall.as_secs_f64() * 1e3,
        outcome.simulation_wall.as_secs_f64() * 1e3
    )
}

/// Seconds as `run` prints a duration.
fn seconds_text(seconds: f64) -> String {
    sim_core::units::SimDuration::from_ps((seconds * 1e12).round() as u64).to_string()
}
