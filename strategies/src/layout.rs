//! The rank layout: which (tensor, context, data, pipeline) coordinates each rank has, and the
//! communicator groups each parallel dimension needs.
//!
//! Ranks are numbered with one dimension varying fastest, Megatron-LM's order by default:
//! tensor fastest (so a tensor group sits inside a server), then context, then data, then
//! pipeline (`tp-cp-dp-pp`). Expert-parallel groups are carved out of the data x context ranks
//! that share a tensor and a pipeline coordinate, as Megatron-Core folds expert parallelism
//! into data parallelism: consecutive runs of `expert` ranks along the (context, data) index.
//!
//! When the experts have a tensor degree of their own or the all-gather dispatcher runs
//! ([`crate::Parallelism::experts_apart`]), the expert side is laid out as Megatron-Core's
//! expert rank generator does (megatron/core/parallel_state.py @ d98e8a64dd,
//! `initialize_model_parallel`: `RankGenerator(tp=expert_tensor_parallel_size,
//! ep=expert_model_parallel_size, dp=expert_data_parallel_size, pp, cp=1, order)`): the same
//! ranks decomposed as expert-tensor x expert x expert-data x pipeline, in the dense order with
//! tensor replaced by expert-tensor, context by expert (Megatron's orders put `ep` right after
//! `cp`, and the expert generator's `cp` is 1) and data by expert-data (Megatron's
//! `tp-cp-ep-dp-pp` becomes `etp-ep-edp-pp`, `tp-cp-ep-pp-dp` becomes `etp-ep-pp-edp`). For the default order and an expert-tensor degree equal to the tensor
//! degree, both give the same groups.

use std::fmt;

use sim_core::graph::RankId;

/// One dimension of the rank grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    /// Megatron tensor parallelism (and sequence parallelism on the same ranks).
    Tensor,
    /// Context parallelism: the sequence split, attention by ring exchange.
    Context,
    /// Data parallelism: replicas of the model.
    Data,
    /// Pipeline parallelism: stages of layers.
    Pipeline,
}

impl Axis {
    /// The grid dimensions.
    pub const ALL: [Axis; 4] = [Axis::Tensor, Axis::Context, Axis::Data, Axis::Pipeline];

    /// Short name used in `parallelism.order` (`tp`, `cp`, `dp`, `pp`).
    pub const fn short(self) -> &'static str {
        match self {
            Axis::Tensor => "tp",
            Axis::Context => "cp",
            Axis::Data => "dp",
            Axis::Pipeline => "pp",
        }
    }

    fn index(self) -> usize {
        match self {
            Axis::Tensor => 0,
            Axis::Context => 1,
            Axis::Data => 2,
            Axis::Pipeline => 3,
        }
    }
}

/// The order ranks are numbered in, fastest-varying dimension first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankOrder(pub [Axis; 4]);

impl Default for RankOrder {
    /// Megatron-LM's `tp-cp-dp-pp`.
    fn default() -> Self {
        RankOrder([Axis::Tensor, Axis::Context, Axis::Data, Axis::Pipeline])
    }
}

impl fmt::Display for RankOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|axis| axis.short()).collect();
        f.write_str(&names.join("-"))
    }
}

impl std::str::FromStr for RankOrder {
    type Err = String;
    /// `"tp-cp-dp-pp"`: each of tp, cp, dp and pp exactly once, fastest first.
    fn from_str(text: &str) -> Result<RankOrder, String> {
        let expected = "each of tp, cp, dp and pp exactly once, fastest-varying first, e.g. \"tp-cp-dp-pp\"";
        let parts: Vec<&str> = text.split('-').map(str::trim).collect();
        if parts.len() != 4 {
            return Err(format!("{text:?} is not a rank order: give {expected}"));
        }
        let mut order = [Axis::Tensor; 4];
        for (slot, part) in order.iter_mut().zip(&parts) {
            *slot = Axis::ALL
                .into_iter()
                .find(|axis| axis.short() == *part)
                .ok_or_else(|| format!("{part:?} in {text:?} is not a dimension: give {expected}"))?;
        }
        let mut seen = [false; 4];
        for axis in order {
            if std::mem::replace(&mut seen[axis.index()], true) {
                return Err(format!("{} appears twice in {text:?}: give {expected}", axis.short()));
            }
        }
        Ok(RankOrder(order))
    }
}

/// A rank's position on every dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Coordinates {
    /// Tensor-parallel index.
    pub tensor: u32,
    /// Context-parallel index.
    pub context: u32,
    /// Data-parallel index.
    pub data: u32,
    /// Pipeline stage.
    pub pipeline: u32,
}

impl Coordinates {
    fn get(&self, axis: Axis) -> u32 {
        [self.tensor, self.context, self.data, self.pipeline][axis.index()]
    }

    fn set(&mut self, axis: Axis, value: u32) {
        match axis {
            Axis::Tensor => self.tensor = value,
            Axis::Context => self.context = value,
            Axis::Data => self.data = value,
            Axis::Pipeline => self.pipeline = value,
        }
    }
}

/// Maps ranks to coordinates and back, and lists communicator groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankLayout {
    /// Size of each dimension, indexed by [`Axis`].
    sizes: [u32; 4],
    order: RankOrder,
    /// Expert-parallel degree (divides context x data).
    expert: u32,
    /// The experts' tensor degree when the expert side is laid out by Megatron-Core's expert
    /// rank generator; `None`: expert groups carved out of data x context.
    expert_tensor: Option<u32>,
}

/// One of the expert side's dimensions (Megatron-Core's expert rank generator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertAxis {
    /// Expert tensor parallelism: each expert's FFN split (`expt_tp`).
    ExpertTensor,
    /// Expert parallelism: which experts a rank holds (`ep`).
    Expert,
    /// Expert data parallelism: replicas of the same experts (`expt_dp`).
    ExpertData,
    /// Pipeline stage (shared with the dense side).
    Pipeline,
}

/// A rank's position on the expert side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExpertCoordinates {
    /// Expert-tensor index.
    pub expert_tensor: u32,
    /// Expert-parallel index.
    pub expert: u32,
    /// Expert-data index.
    pub expert_data: u32,
    /// Pipeline stage.
    pub pipeline: u32,
}

impl ExpertCoordinates {
    fn get(&self, axis: ExpertAxis) -> u32 {
        match axis {
            ExpertAxis::ExpertTensor => self.expert_tensor,
            ExpertAxis::Expert => self.expert,
            ExpertAxis::ExpertData => self.expert_data,
            ExpertAxis::Pipeline => self.pipeline,
        }
    }

    fn set(&mut self, axis: ExpertAxis, value: u32) {
        match axis {
            ExpertAxis::ExpertTensor => self.expert_tensor = value,
            ExpertAxis::Expert => self.expert = value,
            ExpertAxis::ExpertData => self.expert_data = value,
            ExpertAxis::Pipeline => self.pipeline = value,
        }
    }
}

impl RankLayout {
    /// A layout of `tensor x context x data x pipeline` ranks numbered in `order`, with expert
    /// groups of `expert` ranks. Every size must be at least 1 and `expert` must divide
    /// `context x data` (the caller validates).
    pub fn new(
        tensor: u32,
        context: u32,
        data: u32,
        pipeline: u32,
        expert: u32,
        order: RankOrder,
    ) -> RankLayout {
        RankLayout {
            sizes: [tensor, context, data, pipeline],
            order,
            expert: expert.max(1),
            expert_tensor: None,
        }
    }

    /// The same layout with its expert side laid out by Megatron-Core's expert rank generator
    /// with experts split over `expert_tensor` ranks (`Some`), or carved out of data x context
    /// (`None`). The caller validates ([`RankLayout::expert_layout_error`]).
    pub fn with_expert_tensor(mut self, expert_tensor: Option<u32>) -> RankLayout {
        self.expert_tensor = expert_tensor.map(|degree| degree.max(1));
        self
    }

    /// The experts' tensor degree when the expert side follows Megatron-Core's expert rank
    /// generator; `None` when expert groups are carved out of data x context.
    pub fn expert_tensor_degree(&self) -> Option<u32> {
        self.expert_tensor
    }

    /// Whether the expert side follows Megatron-Core's expert rank generator.
    pub fn megatron_experts(&self) -> bool {
        self.expert_tensor.is_some()
    }

    /// The expert side's dimensions, fastest first, with their sizes: the dense order with
    /// tensor replaced by expert-tensor, context by expert and data by expert-data.
    fn expert_order(&self) -> Vec<(ExpertAxis, u32)> {
        let etp = self.expert_tensor.unwrap_or(self.size(Axis::Tensor));
        let per_stage = self.ranks() / self.size(Axis::Pipeline);
        let expert_data = per_stage / (etp * self.expert).max(1);
        let mut order = Vec::with_capacity(4);
        for axis in self.order.0 {
            // Megatron's orders put `ep` right after `cp` (`tp-cp-ep-dp-pp`, `tp-cp-ep-pp-dp`),
            // and the expert generator's `cp` is 1: expert takes context's place.
            order.push(match axis {
                Axis::Tensor => (ExpertAxis::ExpertTensor, etp),
                Axis::Context => (ExpertAxis::Expert, self.expert),
                Axis::Data => (ExpertAxis::ExpertData, expert_data),
                Axis::Pipeline => (ExpertAxis::Pipeline, self.size(Axis::Pipeline)),
            });
        }
        order
    }

    /// Why Megatron-Core would refuse this expert layout, if it would: the world size must
    /// divide into expert-tensor x expert x pipeline ranks (`RuntimeError: world_size is not
    /// divisible by expert_tensor_model_pipeline_parallel size`), and the pipeline groups of
    /// the expert side must be the dense side's (`assert decoder_rank_generator.get_ranks("pp")
    /// == expert_decoder_rank_generator.get_ranks("pp")`; with a pipeline-last order this is
    /// `expert_data_parallel_size == data_parallel_size`), megatron/core/parallel_state.py.
    pub fn expert_layout_error(&self) -> Option<String> {
        let etp = self.expert_tensor?;
        let per_stage = self.ranks() / self.size(Axis::Pipeline);
        if per_stage % (etp * self.expert) != 0 {
            return Some(format!(
                "expert-tensor {etp} x expert {} = {} ranks do not divide the {per_stage} ranks of a pipeline \
                 stage (tensor x context x data): Megatron-Core refuses a world size not divisible by \
                 expert-tensor x expert x pipeline",
                self.expert,
                etp * self.expert
            ));
        }
        let pipeline = self.size(Axis::Pipeline);
        if pipeline > 1 {
            let stride = |sizes: &mut dyn Iterator<Item = (bool, u32)>| -> u32 {
                sizes.take_while(|(is_pipeline, _)| !is_pipeline).map(|(_, size)| size).product()
            };
            let dense = stride(&mut self.order.0.iter().map(|a| (*a == Axis::Pipeline, self.size(*a))));
            let expert =
                stride(&mut self.expert_order().into_iter().map(|(a, s)| (a == ExpertAxis::Pipeline, s)));
            if dense != expert {
                return Some(format!(
                    "with order {} the expert side (expert-tensor {etp} x expert {}) puts the pipeline \
                     stages at a stride of {expert} ranks where the dense side has {dense}: Megatron-Core \
                     requires the same pipeline groups on both sides (with the pipeline not last, the \
                     expert-data degree must equal the data degree)",
                    self.order, self.expert
                ));
            }
        }
        None
    }

    /// The expert-side coordinates of `rank` under Megatron-Core's expert rank generator (with
    /// the expert-tensor degree the tensor degree when experts are carved out of data x
    /// context, whose groups are the same for the default order).
    pub fn expert_coordinates(&self, rank: RankId) -> ExpertCoordinates {
        let mut rest = rank.0;
        let mut coordinates = ExpertCoordinates::default();
        for (axis, size) in self.expert_order() {
            coordinates.set(axis, rest % size.max(1));
            rest /= size.max(1);
        }
        coordinates
    }

    /// The rank at expert-side `coordinates`.
    pub fn expert_rank(&self, coordinates: ExpertCoordinates) -> RankId {
        let mut rank = 0;
        for (axis, size) in self.expert_order().into_iter().rev() {
            rank = rank * size + coordinates.get(axis);
        }
        RankId(rank)
    }

    /// The ranks that differ from `rank` only along expert-side `axes`, in Megatron's order
    /// (the first axis fastest), under Megatron-Core's expert rank generator.
    pub fn expert_axes_group(&self, axes: &[ExpertAxis], rank: RankId) -> Vec<RankId> {
        let order = self.expert_order();
        let base = self.expert_coordinates(rank);
        let sizes: Vec<(ExpertAxis, u32)> =
            order.into_iter().filter(|(axis, _)| axes.contains(axis)).collect();
        let count: u32 = sizes.iter().map(|(_, size)| size).product();
        (0..count)
            .map(|mut index| {
                let mut coordinates = base;
                for (axis, size) in &sizes {
                    coordinates.set(*axis, index % size);
                    index /= size;
                }
                self.expert_rank(coordinates)
            })
            .collect()
    }

    /// The expert-tensor group of `rank`: the ranks that split the same experts' FFNs.
    pub fn expert_tensor_group(&self, rank: RankId) -> Vec<RankId> {
        match self.expert_tensor {
            Some(_) => self.expert_axes_group(&[ExpertAxis::ExpertTensor], rank),
            None => self.group(Axis::Tensor, rank),
        }
    }

    /// The expert-tensor x expert group of `rank` (Megatron-Core's `tp_ep` group), which the
    /// all-gather dispatcher gathers over.
    pub fn expert_tensor_expert_group(&self, rank: RankId) -> Vec<RankId> {
        match self.expert_tensor {
            Some(_) => self.expert_axes_group(&[ExpertAxis::ExpertTensor, ExpertAxis::Expert], rank),
            None => {
                let mut ranks: Vec<RankId> = self
                    .expert_group(rank)
                    .into_iter()
                    .flat_map(|member| self.group(Axis::Tensor, member))
                    .collect();
                ranks.sort();
                ranks
            }
        }
    }

    /// The expert-data group of `rank`: the ranks holding the same expert shards, over which
    /// their gradients are summed.
    pub fn expert_data_group(&self, rank: RankId) -> Vec<RankId> {
        match self.expert_tensor {
            Some(_) => self.expert_axes_group(&[ExpertAxis::ExpertData], rank),
            None => {
                let all = self.data_context_group(rank);
                let expert = self.expert as usize;
                let position = all.iter().position(|r| *r == rank).unwrap_or(0) % expert;
                all.into_iter().enumerate().filter(|(i, _)| i % expert == position).map(|(_, r)| r).collect()
            }
        }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.sizes.iter().product()
    }

    /// Size of one dimension.
    pub fn size(&self, axis: Axis) -> u32 {
        self.sizes[axis.index()]
    }

    /// Expert-parallel degree.
    pub fn expert(&self) -> u32 {
        self.expert
    }

    /// The rank order.
    pub fn order(&self) -> RankOrder {
        self.order
    }

    /// The coordinates of `rank`.
    pub fn coordinates(&self, rank: RankId) -> Coordinates {
        let mut rest = rank.0;
        let mut coordinates = Coordinates::default();
        for axis in self.order.0 {
            let size = self.size(axis);
            coordinates.set(axis, rest % size);
            rest /= size;
        }
        coordinates
    }

    /// The rank at `coordinates`.
    pub fn rank(&self, coordinates: Coordinates) -> RankId {
        let mut rank = 0;
        for axis in self.order.0.iter().rev() {
            rank = rank * self.size(*axis) + coordinates.get(*axis);
        }
        RankId(rank)
    }

    /// The ranks that differ from `rank` only along `axis`, in index order (ring order of
    /// the group's collectives).
    pub fn group(&self, axis: Axis, rank: RankId) -> Vec<RankId> {
        let mut coordinates = self.coordinates(rank);
        (0..self.size(axis))
            .map(|index| {
                coordinates.set(axis, index);
                self.rank(coordinates)
            })
            .collect()
    }

    /// The ranks that differ from `rank` only in context and data (the group gradients are
    /// reduced over when context parallelism is on: every context rank holds full weights).
    pub fn data_context_group(&self, rank: RankId) -> Vec<RankId> {
        let mut coordinates = self.coordinates(rank);
        let mut ranks = Vec::with_capacity((self.size(Axis::Data) * self.size(Axis::Context)) as usize);
        for data in 0..self.size(Axis::Data) {
            for context in 0..self.size(Axis::Context) {
                coordinates.data = data;
                coordinates.context = context;
                ranks.push(self.rank(coordinates));
            }
        }
        ranks
    }

    /// The expert-parallel group of `rank`: `expert` consecutive ranks along the (context,
    /// data) index that share its tensor and pipeline coordinates (under Megatron-Core's expert
    /// rank generator, the ranks that differ only in their expert index).
    pub fn expert_group(&self, rank: RankId) -> Vec<RankId> {
        if self.expert_tensor.is_some() {
            return self.expert_axes_group(&[ExpertAxis::Expert], rank);
        }
        let all = self.data_context_group(rank);
        let position = all.iter().position(|r| *r == rank).unwrap_or(0);
        let start = position / self.expert as usize * self.expert as usize;
        all[start..start + self.expert as usize].to_vec()
    }

    /// The members of `rank`'s expert group on its own node of `node` GPUs (consecutive
    /// ranks): the ranks a DeepEP-style dispatcher's NVLink hop exchanges among.
    pub fn expert_node_group(&self, rank: RankId, node: u32) -> Vec<RankId> {
        let node = node.max(1);
        self.expert_group(rank).into_iter().filter(|r| r.0 / node == rank.0 / node).collect()
    }

    /// The members of `rank`'s expert group at its local index on every node of `node` GPUs:
    /// the ranks a DeepEP-style dispatcher's RDMA hop exchanges among (one per node).
    pub fn expert_rail_group(&self, rank: RankId, node: u32) -> Vec<RankId> {
        let node = node.max(1);
        self.expert_group(rank).into_iter().filter(|r| r.0 % node == rank.0 % node).collect()
    }

    /// Every group along `axis`, each listed once, in order of its first rank.
    pub fn groups(&self, axis: Axis) -> Vec<Vec<RankId>> {
        (0..self.ranks())
            .map(RankId)
            .filter(|rank| self.coordinates(*rank).get(axis) == 0)
            .map(|rank| self.group(axis, rank))
            .collect()
    }
}

/// Rotates each digit of `value`, written in the mixed radix `radices` (least significant
/// first; their product bounds `value`), by the same digit of `shift`, each modulo its radix.
/// Over `shift` in `0..product` these are permutations of `0..product`, one mapping `0` to
/// each value, that keep whole every run of consecutive values aligned to a multiple of
/// `radices[0]`, of `radices[0] * radices[1]`, and so on, and every set of values equal
/// modulo those sizes. With one radix this is the cyclic shift `(value + shift) % radix`.
pub fn rotate_digits(value: u32, shift: u32, radices: &[u32]) -> u32 {
    let (mut value, mut shift) = (value, shift);
    let (mut result, mut place) = (0, 1);
    for &radix in radices {
        let radix = radix.max(1);
        result += (value % radix + shift % radix) % radix * place;
        value /= radix;
        shift /= radix;
        place *= radix;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_order_puts_tensor_ranks_next_to_each_other() {
        // TP 2 x CP 1 x DP 2 x PP 2 = 8 ranks.
        let layout = RankLayout::new(2, 1, 2, 2, 1, RankOrder::default());
        assert_eq!(layout.ranks(), 8);
        assert_eq!(layout.group(Axis::Tensor, RankId(5)), vec![RankId(4), RankId(5)]);
        assert_eq!(layout.group(Axis::Data, RankId(1)), vec![RankId(1), RankId(3)]);
        assert_eq!(layout.group(Axis::Pipeline, RankId(2)), vec![RankId(2), RankId(6)]);
        for rank in (0..8).map(RankId) {
            assert_eq!(layout.rank(layout.coordinates(rank)), rank);
        }
        assert_eq!(layout.groups(Axis::Tensor).len(), 4);
        assert_eq!(layout.groups(Axis::Pipeline).len(), 4);
    }

    #[test]
    fn another_order_moves_the_groups() {
        let order: RankOrder = "dp-tp-cp-pp".parse().unwrap();
        let layout = RankLayout::new(2, 1, 4, 1, 1, order);
        assert_eq!(layout.group(Axis::Data, RankId(0)), vec![RankId(0), RankId(1), RankId(2), RankId(3)]);
        assert_eq!(layout.group(Axis::Tensor, RankId(0)), vec![RankId(0), RankId(4)]);
        assert_eq!(order.to_string(), "dp-tp-cp-pp");
    }

    #[test]
    fn expert_groups_are_carved_out_of_data_and_context() {
        // TP 2, CP 2, DP 2, EP 2: the (context, data) index runs 0..4; EP groups are {0,1}, {2,3}.
        let layout = RankLayout::new(2, 2, 2, 1, 2, RankOrder::default());
        assert_eq!(layout.data_context_group(RankId(0)), vec![RankId(0), RankId(2), RankId(4), RankId(6)]);
        assert_eq!(layout.expert_group(RankId(4)), vec![RankId(4), RankId(6)]);
        assert_eq!(layout.expert_group(RankId(3)), vec![RankId(1), RankId(3)]);
    }

    #[test]
    fn rotating_digits_keeps_aligned_runs_whole() {
        // Radices [2, 4]: runs {0,1}, {2,3}, ... stay runs; a single radix is the cyclic shift.
        for shift in 0..8 {
            let image: Vec<u32> = (0..8).map(|v| rotate_digits(v, shift, &[2, 4])).collect();
            assert_eq!(image[0], shift);
            let mut sorted = image.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
            for run in image.chunks(2) {
                assert_eq!(run[0] / 2, run[1] / 2, "shift {shift}: {image:?}");
            }
            assert_eq!((0..8).map(|v| rotate_digits(v, shift, &[8])).collect::<Vec<_>>(), {
                (0..8).map(|v| (v + shift) % 8).collect::<Vec<_>>()
            });
        }
    }

    #[test]
    fn bad_orders_say_what_is_valid() {
        for bad in ["tp-dp-pp", "tp-tp-dp-pp", "tp-xp-dp-pp"] {
            let error = bad.parse::<RankOrder>().unwrap_err();
            assert!(error.contains("exactly once"), "{error}");
        }
    }
}
