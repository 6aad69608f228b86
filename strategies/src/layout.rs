//! The rank layout: which (tensor, context, data, pipeline) coordinates each rank has, and the
//! communicator groups each parallel dimension needs.
//!
//! Ranks are numbered with one dimension varying fastest, Megatron-LM's order by default:
//! tensor fastest (so a tensor group sits inside a server), then context, then data, then
//! pipeline (`tp-cp-dp-pp`). Expert-parallel groups are carved out of the data x context ranks
//! that share a tensor and a pipeline coordinate, as Megatron-Core folds expert parallelism
//! into data parallelism: consecutive runs of `expert` ranks along the (context, data) index.

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
        RankLayout { sizes: [tensor, context, data, pipeline], order, expert: expert.max(1) }
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
    /// data) index that share its tensor and pipeline coordinates.
    pub fn expert_group(&self, rank: RankId) -> Vec<RankId> {
        let all = self.data_context_group(rank);
        let position = all.iter().position(|r| *r == rank).unwrap_or(0);
        let start = position / self.expert as usize * self.expert as usize;
        all[start..start + self.expert as usize].to_vec()
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
    fn bad_orders_say_what_is_valid() {
        for bad in ["tp-dp-pp", "tp-tp-dp-pp", "tp-xp-dp-pp"] {
            let error = bad.parse::<RankOrder>().unwrap_err();
            assert!(error.contains("exactly once"), "{error}");
        }
    }
}
