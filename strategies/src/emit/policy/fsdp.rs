//! ZeRO-3 as PyTorch FSDP (full shard) runs it: the parameters are sharded over the
//! data-parallel replicas and gathered unit by unit (each numbered block, and the layers
//! around the blocks), one unit ahead, on the gather stream; each unit's gradients are
//! reduce-scattered after its backward, every micro-batch. The optimizer steps the rank's
//! shard; the next iteration's forward waits for the step.
//!
//! Invariant: a rank holds at most two units gathered at once (the one computing and the one
//! prefetched), which is what its memory counts.

use std::ops::Range;

use sim_core::graph::{CollectiveKind, OpId, Pass};

use super::super::Dep;
use super::super::plan::Plan;
use super::super::rank::{GroupClass, RankEmitter};
use super::{Policy, RankPolicy, policy_meta};
use crate::{Bucket, BucketRow, Comm, DATA_STREAM, GATHER_STREAM, GroupKind, StrategyError, shard};
use workloads::model::Model;

/// A group of layers whose parameters ZeRO-3 gathers and whose gradients it scatters together.
pub(in super::super) struct Unit {
    pub(in super::super) layers: Range<usize>,
    /// Parameters of one rank.
    pub(in super::super) parameters: u64,
}

/// The units (FSDP's wrapping) of each chunk of `chunk_layers`: each numbered block, and the
/// layers between blocks.
pub(in super::super) fn units(
    model: &Model,
    local: &[shard::LocalLayer],
    chunk_layers: &[Range<usize>],
) -> Vec<Vec<Unit>> {
    let blocks = model.blocks();
    chunk_layers
        .iter()
        .map(|range| {
            let mut units: Vec<Unit> = Vec::new();
            for index in range.clone() {
                let parameters = local[index].layer.cost.params;
                match units.last_mut() {
                    Some(unit) if blocks[unit.layers.start] == blocks[index] => {
                        unit.layers.end = index + 1;
                        unit.parameters += parameters;
                    }
                    _ => units.push(Unit { layers: index..index + 1, parameters }),
                }
            }
            units
        })
        .collect()
}

/// The report's buckets of a chunk under ZeRO-3: its units, each gathered and scattered whole.
pub(in super::super) fn unit_buckets(plan: &Plan<'_>, units: &[Unit]) -> Vec<Bucket> {
    units
        .iter()
        .filter(|unit| unit.parameters > 0)
        .map(|unit| Bucket {
            layers: unit.layers.clone().collect(),
            bytes: plan.gradient_bytes(unit.parameters),
        })
        .collect()
}

/// The kernel table's rows of a chunk's units (stage `stage`).
pub(in super::super) fn unit_rows(
    plan: &Plan<'_>,
    units: &[Unit],
    stage: u32,
    chunk: usize,
) -> Vec<BucketRow> {
    units
        .iter()
        .filter(|unit| unit.parameters > 0)
        .enumerate()
        .map(|(i, unit)| BucketRow {
            stage,
            chunk,
            index: i,
            collective: "gather-scatter",
            expert: false,
            bytes: plan.gradient_bytes(unit.parameters),
            layers: unit.layers.clone().map(|l| plan.local[l].index).collect(),
        })
        .collect()
}

/// FSDP: the units of each chunk.
pub(in super::super) struct Fsdp {
    pub(in super::super) units: Vec<Vec<Unit>>,
}

impl Policy for Fsdp {
    fn syncs_buckets(&self) -> bool {
        false
    }

    fn report_buckets(&self, plan: &Plan<'_>, chunk: usize) -> Vec<Bucket> {
        unit_buckets(plan, &self.units[chunk])
    }

    fn bucket_rows(&self, plan: &Plan<'_>, stage: u32, chunk: usize) -> Vec<BucketRow> {
        unit_rows(plan, &self.units[chunk], stage, chunk)
    }

    fn gathered_units(&self, _plan: &Plan<'_>, chunk: usize) -> Vec<u64> {
        self.units[chunk].iter().map(|unit| unit.parameters).filter(|&parameters| parameters > 0).collect()
    }

    /// The unit being computed and the one prefetched: the two largest.
    fn gathered_parameters(&self, _plan: &Plan<'_>, _stage: u32, chunks: &[usize]) -> u64 {
        let mut units: Vec<u64> =
            chunks.iter().flat_map(|&k| &self.units[k]).map(|unit| unit.parameters).collect();
        units.sort_unstable_by(|a, b| b.cmp(a));
        units.iter().take(2).sum()
    }

    fn for_rank(&self) -> Box<dyn RankPolicy + '_> {
        Box::new(FsdpRank { units: &self.units, step_end: None })
    }
}

/// A rank's FSDP: the end of its previous optimizer step.
struct FsdpRank<'a> {
    units: &'a [Vec<Unit>],
    /// The previous iteration's last op (its optimizer step): with the weights' shards in host
    /// memory, no shard is fetched before the step has updated it.
    step_end: Option<OpId>,
}

impl RankPolicy for FsdpRank<'_> {
    fn begin_iteration(&mut self, emitter: &mut RankEmitter<'_, '_>, previous_end: Option<OpId>) {
        self.step_end = previous_end;
        super::wait_for_step(emitter, previous_end);
    }

    /// Gather each unit's parameters before its forward, the next unit's as soon as this one
    /// starts (one unit of prefetch), and free them after.
    fn forward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
    ) -> Result<(), StrategyError> {
        let units = &self.units[chunk];
        let mut gathered = self.gather(emitter, chunk, 0, &[], Pass::Forward);
        for (u, unit) in units.iter().enumerate() {
            emitter.waiting.push(Dep::Local(gathered));
            let first = emitter.buffer.ops.len();
            for index in unit.layers.clone() {
                emitter.forward_layer(index, micro, false)?;
            }
            if u + 1 < units.len() {
                let start: Vec<Dep> = (first < emitter.buffer.ops.len())
                    .then_some(Dep::Local(first as u32))
                    .into_iter()
                    .collect();
                gathered = self.gather(emitter, chunk, u + 1, &start, Pass::Forward);
            }
        }
        Ok(())
    }

    /// Per unit in reverse, gather its parameters (prefetched one unit ahead), run its
    /// backward, reduce-scatter its gradients; every micro-batch.
    fn backward_chunk(
        &mut self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        micro: u32,
        _last: bool,
    ) -> Result<Option<u32>, StrategyError> {
        let plan = emitter.plan;
        let units = &self.units[chunk];
        let mut last_sync = None;
        let mut gathered = self.gather(emitter, chunk, units.len() - 1, &[], Pass::BackwardData);
        // Out-of-core activations: their prefetches around each layer's backward, as the
        // bucketed backward issues them (after the first gather, which comes first on the
        // in-order copy stream when the weights' shards are fetched on it too).
        let mut offload = emitter.offload_backward(plan.chunk_layers[chunk].clone(), micro);
        for u in (0..units.len()).rev() {
            emitter.waiting.push(Dep::Local(gathered));
            let first = emitter.buffer.ops.len();
            let mut ready = None;
            for index in units[u].layers.clone().rev() {
                ready = emitter.backward_layer_offloaded(&mut offload, index, micro)?.or(ready);
            }
            if u > 0 {
                let start: Vec<Dep> = (first < emitter.buffer.ops.len())
                    .then_some(Dep::Local(first as u32))
                    .into_iter()
                    .collect();
                gathered = self.gather(emitter, chunk, u - 1, &start, Pass::BackwardData);
            }
            if let Some(ready) = ready
                && units[u].parameters > 0
            {
                let comm = Comm {
                    group: GroupKind::Data,
                    kind: CollectiveKind::ReduceScatter,
                    bytes: plan.gradient_bytes(units[u].parameters),
                    what: "",
                };
                let group = emitter.group(GroupClass::Data);
                let label = emitter.comm_label("zero-3 reduce-scatter gradients");
                let meta = policy_meta(emitter, ORIGIN, Pass::BackwardWeight);
                let synced = emitter.collective(comm, DATA_STREAM, group, label, &[Dep::Local(ready)], meta);
                // A host optimizer (ZeRO-Offload, ZeRO-Infinity): the rank's gradient shard to
                // host memory after every reduce-scatter, where the step reads it.
                last_sync =
                    Some(emitter.offload_gradients(comm.bytes, &[Dep::Local(synced)]).unwrap_or(synced));
            }
        }
        Ok(last_sync)
    }
}

impl FsdpRank<'_> {
    /// The allgather of unit `unit`'s parameters for pass `pass`, on the gather stream; with
    /// the weights' shards offloaded (ZeRO-Infinity), after the copy of the rank's shard to
    /// the device.
    fn gather(
        &self,
        emitter: &mut RankEmitter<'_, '_>,
        chunk: usize,
        unit: usize,
        deps: &[Dep],
        pass: Pass,
    ) -> u32 {
        let plan = emitter.plan;
        let bytes = plan.weight_bytes(self.units[chunk][unit].parameters);
        let host = plan.offload.as_ref().and_then(|o| o.host.as_ref()).filter(|h| h.parameters_offloaded);
        let fetched;
        let deps = match host {
            Some(host) if bytes.0 > 0 => {
                let after: Vec<Dep> = deps.iter().copied().chain(self.step_end.map(Dep::Global)).collect();
                fetched =
                    [Dep::Local(emitter.fetch_parameter_shard(host, host.shard(bytes.0), &after, pass))];
                &fetched[..]
            }
            _ => deps,
        };
        let comm = Comm { group: GroupKind::Data, kind: CollectiveKind::AllGather, bytes, what: "" };
        let group = emitter.group(GroupClass::Data);
        let label = emitter.comm_label(GATHER_LABEL);
        let meta = policy_meta(emitter, ORIGIN, pass);
        emitter.collective(comm, GATHER_STREAM, group, label, deps, meta)
    }
}

/// The label of a ZeRO-3 parameter allgather (FSDP's and DeepSpeed's).
pub(in super::super) const GATHER_LABEL: &str = "zero-3 allgather parameters";

/// The origin of FSDP's gathers and reduce-scatters.
const ORIGIN: &str = "fsdp";
