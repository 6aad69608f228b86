//! The kernel-time table: every layer as one rank runs it (its local shapes and collectives)
//! and the time and FLOPs of its forward, backward-data and backward-weight kernels, computed
//! once per split and shared by the configurations of a search ([`LayerTables`]).
//!
//! Invariant: a table depends only on the model, device, compute model and [`TableKey`]; two
//! strategies that agree on them get equal tables, so sharing one changes no result.

use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};

use sim_core::graph::CollectiveKind;
use sim_core::units::SimDuration;

use super::Kernel;
use super::plan::Plan;
use crate::{GroupKind, Strategy, StrategyError, pipeline, shard};
use workloads::compute::{ComputeError, ComputeModel};
use workloads::device::{Device, Dtype};
use workloads::layer::{Layer, LayerKind, Pass};
use workloads::model::Model;

/// Local layers and their kernel times, shared by the configurations of a search that split a
/// model the same way ("kernel tables shared between configurations"): the estimate and the
/// lowering of every strategy with the same split, micro-batch and precision take them from
/// here instead of building and pricing them again. Bound to one model, device and compute
/// model: a strategy on other ones (compared by address) does not use it.
pub struct LayerTables<'a> {
    model: &'a Model,
    device: &'a Device,
    compute: &'a ComputeModel,
    /// A search has a few dozen splits: a list is as fast as a map and needs no hashing of
    /// floats.
    tables: RwLock<Vec<(TableKey, Arc<LayerTable>)>>,
}

/// What the local layers and their kernel times depend on besides the model, device and
/// compute model.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TableKey {
    split: shard::Split,
    micro_batch: u64,
    precision: Dtype,
    fusion: workloads::fusion::Fusion,
    batch_norm_group: workloads::groupbn::BatchNormGroup,
}

/// Every layer as one rank runs it, its forward, backward-data and backward-weight kernels,
/// and the pipeline partitions these kernels give.
#[derive(Debug)]
pub(super) struct LayerTable {
    pub(super) local: Arc<Vec<shard::LocalLayer>>,
    pub(super) kernels: Arc<Vec<[Kernel; 3]>>,
    /// [`Plan::beside`].
    pub(super) beside: Arc<Vec<[Option<SimDuration>; 3]>>,
    /// Layer ranges of each chunk, by chunk count ([`Plan::partition`]).
    partitions: Mutex<Vec<(usize, Vec<Range<usize>>)>>,
    /// Pipeline schedules made for strategies of this table ([`LayerTable::orders`]).
    orders: Mutex<Vec<(OrdersKey, Orders)>>,
}

/// Every stage's schedule, shared.
type Orders = Arc<Vec<Vec<pipeline::Action>>>;

/// Everything a stage's schedule is made from ([`pipeline::orders`], and Megatron-Core's
/// pairing under the EP A2A overlap).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OrdersKey {
    pub(super) schedule: pipeline::PipelineSchedule,
    pub(super) stages: u32,
    pub(super) chunks: u32,
    pub(super) group: u32,
    pub(super) micro_batches: u32,
    /// ZB-V's chunk times (empty for the other schedules).
    pub(super) times: Vec<[u64; 3]>,
    pub(super) paired: bool,
}

impl LayerTable {
    /// [`Plan::partition`] of `model` into `chunks` by this table's kernels, computed once
    /// per chunk count.
    pub(super) fn partition(&self, model: &Model, chunks: usize) -> Vec<Range<usize>> {
        let cached = |list: &[(usize, Vec<Range<usize>>)]| {
            list.iter().find(|(count, _)| *count == chunks).map(|(_, ranges)| ranges.clone())
        };
        if let Some(ranges) = self.partitions.lock().ok().and_then(|list| cached(&list)) {
            return ranges;
        }
        let ranges = Plan::partition(model, &self.kernels, chunks);
        if let Ok(mut list) = self.partitions.lock()
            && cached(&list).is_none()
        {
            list.push((chunks, ranges.clone()));
        }
        ranges
    }
}

impl LayerTable {
    /// Every stage's schedule for `key`, made once per key for all the strategies of this
    /// table (a search's ZeRO stages share one; ZB-V's takes most of an estimate's time).
    pub(super) fn orders(&self, key: OrdersKey) -> Orders {
        let cached = |list: &[(OrdersKey, Orders)]| {
            list.iter().find(|(k, _)| *k == key).map(|(_, orders)| Arc::clone(orders))
        };
        if let Some(orders) = self.orders.lock().ok().and_then(|list| cached(&list)) {
            return orders;
        }
        let mut orders =
            pipeline::orders(key.schedule, key.stages, key.chunks, key.group, key.micro_batches, &key.times);
        if key.paired {
            orders.iter_mut().for_each(pipeline::pair_steady_state);
        }
        let orders = Arc::new(orders);
        if let Ok(mut list) = self.orders.lock()
            && cached(&list).is_none()
        {
            list.push((key, Arc::clone(&orders)));
        }
        orders
    }
}

impl std::fmt::Debug for LayerTables<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tables = self.tables.read().map_or(0, |tables| tables.len());
        f.debug_struct("LayerTables").field("model", &self.model.name).field("tables", &tables).finish()
    }
}

impl<'a> LayerTables<'a> {
    /// Empty tables for strategies on `model`, `device` and `compute`.
    pub fn new(model: &'a Model, device: &'a Device, compute: &'a ComputeModel) -> LayerTables<'a> {
        LayerTables { model, device, compute, tables: RwLock::new(Vec::new()) }
    }

    /// Whether `strategy` runs on this table's model, device and compute model.
    fn serves(&self, strategy: &Strategy<'_>) -> bool {
        std::ptr::eq(self.model, strategy.model)
            && std::ptr::eq(self.device, strategy.device)
            && std::ptr::eq(self.compute, strategy.compute)
    }

    /// `strategy`'s local layers and kernels: from its tables if it has them and they hold
    /// this split, else built (and kept there). Errors are not kept: the next strategy with
    /// the split gets the same error again.
    pub(super) fn layers_and_kernels(strategy: &Strategy<'_>) -> Result<Arc<LayerTable>, StrategyError> {
        let key = TableKey {
            split: strategy.parallelism.split(),
            micro_batch: strategy.micro_batch,
            precision: strategy.precision,
            fusion: strategy.fusion,
            batch_norm_group: strategy.batch_norm_group,
        };
        let Some(tables) = strategy.layer_tables.filter(|tables| tables.serves(strategy)) else {
            return build_layer_table(strategy);
        };
        let found = |list: &[(TableKey, Arc<LayerTable>)]| {
            list.iter().find(|(k, _)| *k == key).map(|(_, table)| Arc::clone(table))
        };
        if let Some(table) = tables.tables.read().ok().and_then(|list| found(&list)) {
            return Ok(table);
        }
        let table = build_layer_table(strategy)?;
        if let Ok(mut list) = tables.tables.write() {
            // Another thread may have built it meanwhile: keep one copy (they are equal).
            if let Some(existing) = found(&list) {
                return Ok(existing);
            }
            list.push((key, Arc::clone(&table)));
        }
        Ok(table)
    }
}

/// Every layer of `strategy`'s model as one rank runs it, and its kernels' times.
fn build_layer_table(strategy: &Strategy<'_>) -> Result<Arc<LayerTable>, StrategyError> {
    let model = strategy.model;
    let p = &strategy.parallelism;
    let mut local = shard::local_layers(model, p.split(), strategy.micro_batch, strategy.precision)?;
    strategy.fusion.apply(local.iter_mut().map(|entry| &mut entry.layer));
    let group = strategy.batch_norm_group;
    group.apply_ordering_add(local.iter_mut().map(|entry| &mut entry.layer));
    let mut kernels: Vec<[Kernel; 3]> = Vec::with_capacity(local.len());
    // Repeated blocks (a transformer's layers, a ResNet stage's bottlenecks) run the same
    // kernels: a layer doing the same work as the one at its position in the previous block
    // takes its times instead of pricing them again.
    let twins = block_twins(model.blocks());
    for (index, layer) in local.iter().enumerate() {
        if let Some(twin) = twins.get(index).copied().flatten()
            && twin > 0
            && same_work(&local[twin], layer)
        {
            kernels.push(kernels[twin]);
            continue;
        }
        let forward = strategy.kernel(layer, Pass::Forward)?;
        // The input of the first layer needs no gradient.
        let backward_data = if index == 0 { None } else { strategy.kernel(layer, Pass::BackwardData)? };
        let backward_weight = strategy.kernel(layer, Pass::BackwardWeight)?;
        let exchange = group_exchange(group, &layer.layer)?;
        let (forward, mut backward_data, mut backward_weight) =
            (with_exchange(forward, exchange), with_exchange(backward_data, exchange), backward_weight);
        let forward = match filter_copies(strategy, layer)? {
            Some((gather, alltoall)) => {
                // The alltoall's copies precede the first backward kernel the layer has.
                if backward_data.is_some() {
                    backward_data = with_exchange(backward_data, alltoall);
                } else {
                    backward_weight = with_exchange(backward_weight, alltoall);
                }
                with_exchange(forward, gather)
            }
            None => forward,
        };
        kernels.push([forward, backward_data, backward_weight]);
    }
    let mut beside = Vec::new();
    if strategy.compute.slows_beside_communication() {
        for (index, layer) in local.iter().enumerate() {
            let data = if index == 0 {
                None
            } else {
                strategy.kernel_beside_communication(layer, Pass::BackwardData)?
            };
            let exchange = group_exchange(group, &layer.layer)?;
            let add = |time: Option<SimDuration>| time.map(|time| time.saturating_add(exchange));
            beside.push([
                add(strategy.kernel_beside_communication(layer, Pass::Forward)?),
                add(data),
                strategy.kernel_beside_communication(layer, Pass::BackwardWeight)?,
            ]);
        }
    }
    Ok(Arc::new(LayerTable {
        local: Arc::new(local),
        kernels: Arc::new(kernels),
        beside: Arc::new(beside),
        partitions: Mutex::new(Vec::new()),
        orders: Mutex::new(Vec::new()),
    }))
}

/// The GPU copies around ChainerMN's allgather function on a filter-split layer whose backward
/// is its alltoall (`filter-backward = "output-alltoall"`), as (forward, backward) time, each
/// copy its own kernel over the layer's whole output `Y` (`B y_l w` bytes) at the compute
/// model's memory rate; `None` for other layers. Chainer v7.0.0 and CuPy:
/// - forward: `F.concat` of the `p` gathered blocks, `xp.concatenate` (`chainer/functions/
///   array/concat.py`): reads and writes `Y`;
/// - backward: `Concat.backward` splits the gradient into `p` views (`split_axis`, `xp.split`),
///   which `MpiCommunicatorBase.alltoall` flattens (`x.reshape(-1)` of a non-contiguous view
///   copies: `p` kernels of `2 Y / p`) and joins (`xp.hstack`: `2 Y`); `AllGather.backward`
///   then `xp.stack`s the `p` received blocks (`2 Y`) and sums them (`.sum(axis=0)`: reads `Y`,
///   writes `Y / p`) (`chainermn/communicators/mpi_communicator_base.py`,
///   `chainermn/functions/collective_communication.py`).
fn filter_copies(
    strategy: &Strategy<'_>,
    layer: &shard::LocalLayer,
) -> Result<Option<(SimDuration, SimDuration)>, StrategyError> {
    let Some(alltoall) = layer
        .before_backward
        .iter()
        .find(|c| c.group == GroupKind::Filter && c.kind == CollectiveKind::AllToAll)
    else {
        return Ok(None);
    };
    let output = alltoall.bytes.0 as f64;
    let blocks = strategy.parallelism.filter.max(1);
    let p = f64::from(blocks);
    let copy = |bytes: f64, class| {
        strategy
            .compute
            .duration(strategy.device, strategy.precision.storage(), 0.0, bytes, class)
            .map_err(|source| StrategyError::Compute { layer: layer.layer.name.clone(), source })
    };
    let elementwise = workloads::layer::OpClass::Elementwise;
    // Reading and writing `Y` once: the forward's concat, the backward's hstack and stack.
    let whole = copy(2.0 * output, elementwise)?;
    let flatten = copy(2.0 * output / p, elementwise)?.checked_mul(u64::from(blocks)).map_err(|error| {
        StrategyError::Compute { layer: layer.layer.name.clone(), source: ComputeError::Overflow(error) }
    })?;
    let backward = flatten
        .saturating_add(whole)
        .saturating_add(whole)
        .saturating_add(copy(output + output / p, workloads::layer::OpClass::Reduction)?);
    let forward = whole;
    Ok(Some((forward, backward)))
}

/// What a batch norm's kernel (forward or backward) waits for its group's peers under
/// `group` ([`workloads::groupbn::BatchNormGroup::exchange_time`]): on the kernel's critical path,
/// as every CTA spins until the peer's sums arrive. Zero for other layers and without a group.
fn group_exchange(
    group: workloads::groupbn::BatchNormGroup,
    layer: &Layer,
) -> Result<SimDuration, StrategyError> {
    if !group.is_grouped() || layer.kind != LayerKind::BatchNorm {
        return Ok(SimDuration::ZERO);
    }
    group.exchange_time(workloads::groupbn::channels(layer)).map_err(|error| StrategyError::Compute {
        layer: layer.name.clone(),
        source: ComputeError::Duration(error),
    })
}

/// `kernel` lengthened by `exchange` (a batch norm's kernel that does no other work still
/// runs, to exchange).
fn with_exchange(kernel: Kernel, exchange: SimDuration) -> Kernel {
    if exchange == SimDuration::ZERO {
        return kernel;
    }
    let (time, flops) = kernel.unwrap_or((SimDuration::ZERO, 0.0));
    Some((time.saturating_add(exchange), flops))
}

/// For every layer in a numbered block, the layer at the same position in the block before
/// (if that block is as long), a candidate for the same kernels.
fn block_twins(blocks: &[Option<u32>]) -> Vec<Option<usize>> {
    let mut twins = vec![None; blocks.len()];
    // Layer ranges of the previous block and of the current one.
    let mut previous: Option<Range<usize>> = None;
    let mut current: Option<Range<usize>> = None;
    for (index, block) in blocks.iter().enumerate() {
        let Some(block) = block else { continue };
        match &mut current {
            Some(range) if range.end == index && blocks[range.start] == Some(*block) => range.end += 1,
            _ => {
                previous = current.take();
                current = Some(index..index + 1);
            }
        }
        if let (Some(previous), Some(current)) = (&previous, &current) {
            let twin = previous.start + (index - current.start);
            if twin < previous.end {
                twins[index] = Some(twin);
            }
        }
    }
    twins
}

/// Whether two local layers price the same: the same kind, shapes and cost (the name aside),
/// and the same share of the work.
fn same_work(a: &shard::LocalLayer, b: &shard::LocalLayer) -> bool {
    a.work_divisor == b.work_divisor
        && a.work_multiplier.to_bits() == b.work_multiplier.to_bits()
        && a.layer.kind == b.layer.kind
        && a.layer.input == b.layer.input
        && a.layer.output == b.layer.output
        && a.layer.cost == b.layer.cost
}
