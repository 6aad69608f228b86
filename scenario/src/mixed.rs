//! A scenario on node groups of different devices (`[[cluster.node-groups]]`): lowered once
//! per device type with one pipeline split for all, the graphs' compute durations spliced
//! rank by rank ([`sim_core::graph::ExecGraph::take_compute_times`]), so that each rank runs
//! its own device's kernels and the engine makes every synchronous step wait for the slowest
//! rank; and the utilisation of each device type read back from the run.

use serde::Serialize;
use sim_core::graph::RankId;
use sim_core::stats::RankBreakdown;
use sim_core::units::SimDuration;
use strategies::{Lowered, StageSummary, Strategy, StrategyError};

use crate::file::node_groups::{NodeGroups, StagePlacement};
use crate::{Scenario, simulation::SimulationError};

/// How one device type of a mixed cluster was used over a run (the noise-free iterations).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceUtilisation {
    /// The device, as the report names it.
    pub device: String,
    /// Its catalog name (`a100-sxm4-80gb`): the key of its sweep columns
    /// (`devices.a100-sxm4-80gb.busy`). Not in `run --json`, which names the device by `device`.
    #[serde(skip)]
    pub name: String,
    /// GPUs of this type.
    pub gpus: u32,
    /// Share of the run's wall time the type's GPUs computed (mean over them, 0 to 1): the
    /// slowest type is near 1 when compute-bound, a faster one waits for it.
    pub busy: f64,
    /// FLOPs per second one of its GPUs ran (recomputation not included), in TFLOP/s.
    pub achieved_tflops_per_device: f64,
    /// The device's datasheet peak for the compute dtype, in TFLOP/s.
    pub peak_tflops_per_device: f64,
    /// Achieved over peak.
    pub mfu: f64,
}

/// Lowers `scenario`: as [`Strategy::lower`] on one device type; on mixed node groups, once
/// per device type with the same pipeline split ([`chunk_layers`]), each rank's compute
/// durations taken from its own device's lowering.
pub(crate) fn lower(scenario: &Scenario) -> Result<Lowered, StrategyError> {
    let base = scenario.strategy();
    let Some(groups) = scenario.node_groups.as_deref().filter(|groups| groups.is_mixed()) else {
        return base.lower();
    };
    let ranges = chunk_layers(scenario, groups)?;
    let mut lowered = Strategy { chunk_layers: Some(&ranges), ..base.clone() }.lower()?;
    let types = groups.type_of_group();
    let type_count = types.iter().copied().max().unwrap_or(0) + 1;
    for kind in 1..type_count {
        let Some(group) = types.iter().position(|t| *t == kind).map(|index| &groups.groups[index]) else {
            continue;
        };
        let other = Strategy {
            device: &group.device,
            compute: &group.compute,
            chunk_layers: Some(&ranges),
            ..base.clone()
        }
        .lower()?;
        let on_this_type = |rank: RankId| types[groups.group_of_rank(rank.0)] == kind;
        lowered.graph.take_compute_times(&other.graph, &on_this_type)?;
    }
    Ok(lowered)
}

/// The layer ranges of the pipeline chunks every device type's lowering shares: the split
/// on the first group's device (`in-order`), or each stage's layers balanced to the slowest
/// device among its ranks (`by-speed`).
pub(crate) fn chunk_layers(
    scenario: &Scenario,
    groups: &NodeGroups,
) -> Result<Vec<std::ops::Range<usize>>, StrategyError> {
    let base = scenario.strategy();
    if groups.stage_placement == StagePlacement::InOrder {
        return base.chunk_layer_ranges();
    }
    let layout = scenario.parallelism.layout();
    let types = groups.type_of_group();
    let pipeline = scenario.parallelism.pipeline as usize;
    // The device types (by group index of their first appearance) among each stage's ranks.
    let mut stage_groups: Vec<Vec<usize>> = vec![Vec::new(); pipeline];
    for rank in 0..layout.ranks() {
        let stage = layout.coordinates(RankId(rank)).pipeline as usize;
        let group = groups.group_of_rank(rank);
        let first_of_type = types.iter().position(|t| *t == types[group]).unwrap_or(group);
        if let Some(list) = stage_groups.get_mut(stage)
            && !list.contains(&first_of_type)
        {
            list.push(first_of_type);
        }
    }
    let strategies: Vec<Vec<Strategy<'_>>> = stage_groups
        .iter()
        .map(|list| {
            list.iter()
                .map(|&index| {
                    let group = &groups.groups[index];
                    Strategy { device: &group.device, compute: &group.compute, ..base.clone() }
                })
                .collect()
        })
        .collect();
    let by_stage: Vec<Vec<&Strategy<'_>>> = strategies.iter().map(|list| list.iter().collect()).collect();
    Strategy::stage_layers_by_speed(&by_stage)
}

/// The stage of each rank's work: `layout.coordinates(rank).pipeline`.
fn stage_of(scenario: &Scenario, rank: u32) -> usize {
    scenario.parallelism.layout().coordinates(RankId(rank)).pipeline as usize
}

/// The memory each group's GPUs need: of each group in order, the most loaded stage among
/// its ranks' stages.
pub(crate) fn group_memory(
    scenario: &Scenario,
    groups: &NodeGroups,
    stages: &[StageSummary],
) -> Vec<workloads::memory::MemoryBreakdown> {
    let gpus = groups.groups.iter().map(|g| g.nodes * groups.gpus_per_node).sum::<u32>();
    groups
        .groups
        .iter()
        .map(|group| {
            let first = group.first_node * groups.gpus_per_node;
            let ranks = first..(first + group.nodes * groups.gpus_per_node).min(gpus);
            ranks
                .filter_map(|rank| stages.get(stage_of(scenario, rank)))
                .map(|stage| stage.memory)
                .max_by_key(|memory| memory.total())
                .unwrap_or_default()
        })
        .collect()
}

/// Each stage's memory checked against the device of every group its ranks run on: an error
/// names the first group whose device it does not fit.
pub(crate) fn check_memory(
    scenario: &Scenario,
    groups: &NodeGroups,
    stages: &[StageSummary],
    context: &dyn Fn() -> String,
) -> Result<(), SimulationError> {
    let memories = group_memory(scenario, groups, stages);
    for (index, (group, memory)) in groups.groups.iter().zip(memories).enumerate() {
        memory.check(&group.device).map_err(|source| SimulationError::Memory {
            context: format!("{} on cluster.node-groups[{index}] ({})", context(), group.device.name),
            source,
            hint: Box::default(),
        })?;
    }
    Ok(())
}

/// [`Strategy::estimate_fastest`] of `scenario` on its mixed `groups`: the split the lowering
/// gives ([`chunk_layers`]), the memory of the first group's device's strategy (as the
/// lowering's, which [`check_memory`] checks), and a bound pricing each kernel at the fastest
/// device type's time for it. Why the fastest: every rank runs each of its kernels on its own
/// device, which takes at least the fastest type's time for that kernel, and the bound is a
/// sum and maximum of kernel times (and collective floors of the cluster's shared links, the
/// least capable group's); so it stays a lower bound of every placement the search simulates,
/// and no configuration that could win is pruned. A bound on the slowest device, or the first
/// group's, could exceed the simulation of a configuration whose busy stages run on faster
/// devices, and prune a winner. `first` is the strategy of the first group's device (with the
/// search's shared kernel tables).
pub(crate) fn estimate(
    scenario: &Scenario,
    groups: &NodeGroups,
    first: &Strategy<'_>,
    comm_floor: &dyn Fn(&strategies::Comm) -> SimDuration,
) -> Result<strategies::Estimate, StrategyError> {
    let ranges = chunk_layers(scenario, groups)?;
    let first = Strategy { chunk_layers: Some(&ranges), ..first.clone() };
    let types = groups.type_of_group();
    let type_count = types.iter().copied().max().unwrap_or(0) + 1;
    let base = scenario.strategy();
    let others: Vec<Strategy<'_>> = (1..type_count)
        .filter_map(|kind| types.iter().position(|t| *t == kind).map(|index| &groups.groups[index]))
        .map(|group| Strategy {
            device: &group.device,
            compute: &group.compute,
            chunk_layers: Some(&ranges),
            ..base.clone()
        })
        .collect();
    let all: Vec<&Strategy<'_>> = std::iter::once(&first).chain(&others).collect();
    Strategy::estimate_fastest(&all, comm_floor)
}

/// The utilisation of each device type over a run of `total` (its `iterations` iterations),
/// from each rank's breakdown (`per_rank[i]` is rank `ranks[i]`'s) and its stage's FLOPs.
pub(crate) fn utilisation(
    scenario: &Scenario,
    groups: &NodeGroups,
    ranks: &[RankId],
    per_rank: &[RankBreakdown],
    stages: &[StageSummary],
    total: SimDuration,
) -> Result<Vec<DeviceUtilisation>, SimulationError> {
    let types = groups.type_of_group();
    let type_count = types.iter().copied().max().map_or(0, |max| max + 1);
    let seconds = total.as_secs_f64();
    let iterations = f64::from(scenario.iterations.max(1));
    let mut result = Vec::with_capacity(type_count);
    for kind in 0..type_count {
        let members: Vec<usize> = (0..groups.groups.len()).filter(|g| types[*g] == kind).collect();
        let device = &groups.groups[members[0]].device;
        let gpus: u32 = members.iter().map(|g| groups.groups[*g].nodes * groups.gpus_per_node).sum();
        let (mut simulated, mut busy_ps, mut flops) = (0u64, 0u128, 0.0f64);
        for (rank, breakdown) in ranks.iter().zip(per_rank) {
            if types[groups.group_of_rank(rank.0)] != kind {
                continue;
            }
            simulated += 1;
            busy_ps += u128::from(breakdown.compute.as_ps());
            flops += stages.get(stage_of(scenario, rank.0)).map_or(0.0, |stage| stage.flops) * iterations;
        }
        let simulated_f = simulated.max(1) as f64;
        let busy = if total.as_ps() == 0 { 0.0 } else { busy_ps as f64 / simulated_f / total.as_ps() as f64 };
        let achieved = if seconds > 0.0 { flops / simulated_f / seconds } else { 0.0 };
        let peak = device.peak(scenario.precision)?.per_second();
        result.push(DeviceUtilisation {
            device: device.display_name.clone(),
            name: device.name.clone(),
            gpus,
            busy,
            achieved_tflops_per_device: achieved / 1e12,
            peak_tflops_per_device: peak / 1e12,
            mfu: achieved / peak,
        });
    }
    Ok(result)
}

/// The mean of the GPUs' peaks for the compute dtype, in FLOP/s: a mixed cluster's MFU is
/// its achieved rate over this.
pub(crate) fn mean_peak(scenario: &Scenario, groups: &NodeGroups) -> Result<f64, SimulationError> {
    let (mut sum, mut gpus) = (0.0, 0.0);
    for group in &groups.groups {
        let count = f64::from(group.nodes * groups.gpus_per_node);
        sum += group.device.peak(scenario.precision)?.per_second() * count;
        gpus += count;
    }
    Ok(if gpus > 0.0 { sum / gpus } else { 0.0 })
}
