//! What an op is for, beyond what it does ([`super::OpKind`]): the metadata the builder of a
//! graph attaches to each op ([`OpMeta`]), so that whoever reads the graph back (a report's
//! breakdown, a timeline export) asks the op instead of guessing from its stream or label.
//!
//! An [`OpMeta`] says: where its time goes ([`Work`]: the device, the host thread launching
//! kernels, a data loader, the input hand-over, the staging of a message through host memory),
//! the model layer it belongs to (an index into [`super::ExecGraph::layer_name`]'s table), the
//! pass ([`Pass`]), the communicator it talks over ([`GroupKind`]) and what emitted it
//! ([`Origin`]: a policy or mechanism, named in the graph's table,
//! [`super::ExecGraph::origin_name`]). Every field is optional; a graph built without metadata
//! (an imported trace) has [`OpMeta::NONE`] everywhere, which reads as device work of nothing
//! in particular.
//!
//! Invariant: an `OpMeta` is 6 bytes with 2-byte alignment, so it fits in [`super::Op`]'s
//! padding and an op stays 32 bytes (graphs reach tens of millions of ops).

use std::fmt;

/// A communicator kind: which parallel dimension a collective or transfer belongs to (the
/// report's breakdown of exposed communication is by these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupKind {
    /// Tensor (and sequence) parallel collectives.
    Tensor,
    /// Pipeline sends and receives between stages.
    Pipeline,
    /// Gradient and parameter synchronisation over data-parallel replicas.
    Data,
    /// Context-parallel key/value ring.
    Context,
    /// Expert-parallel all-to-all.
    Expert,
    /// Filter-parallel allgathers and input-gradient allreduces (CNNs).
    Filter,
    /// Channel-parallel allreduces and input-gradient allgathers (CNNs).
    Channel,
    /// Spatial halo exchanges and the allgather before the first non-spatial layer (CNNs).
    Spatial,
}

impl GroupKind {
    /// Every kind, in report order.
    pub const ALL: [GroupKind; 8] = [
        GroupKind::Tensor,
        GroupKind::Pipeline,
        GroupKind::Data,
        GroupKind::Context,
        GroupKind::Expert,
        GroupKind::Filter,
        GroupKind::Channel,
        GroupKind::Spatial,
    ];

    /// The name used in reports.
    pub const fn name(self) -> &'static str {
        match self {
            GroupKind::Tensor => "tensor",
            GroupKind::Pipeline => "pipeline",
            GroupKind::Data => "data",
            GroupKind::Context => "context",
            GroupKind::Expert => "expert",
            GroupKind::Filter => "filter",
            GroupKind::Channel => "channel",
            GroupKind::Spatial => "spatial",
        }
    }

    /// The position in [`GroupKind::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The training pass an op belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// A layer's forward.
    Forward,
    /// A layer's gradient with respect to its input.
    BackwardData,
    /// A layer's gradient with respect to its weights (and its accumulation).
    BackwardWeight,
    /// A layer's forward run again in the backward pass (activation recomputation).
    Recompute,
    /// The optimizer step.
    Optimizer,
}

impl Pass {
    /// Every pass, in order.
    pub const ALL: [Pass; 5] =
        [Pass::Forward, Pass::BackwardData, Pass::BackwardWeight, Pass::Recompute, Pass::Optimizer];

    /// `"forward"`, `"backward-data"`, `"backward-weight"`, `"recompute"`, `"optimizer"`.
    pub const fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::BackwardData => "backward-data",
            Pass::BackwardWeight => "backward-weight",
            Pass::Recompute => "recompute",
            Pass::Optimizer => "optimizer",
        }
    }
}

/// Where an op's time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Work {
    /// On the device: a kernel, or data moving (by the op's kind). The default.
    #[default]
    Device = 0,
    /// The host thread's launch of a kernel (or another call that holds it, such as a
    /// synchronisation): host time.
    Launch,
    /// A data loader's work (loading a batch, serialising it): host time.
    Loader,
    /// The hand-over of a batch to the training loop (taking it from the loader, its
    /// broadcast to the model-parallel group and unpacking, the loop's fetch of the next
    /// one): host time.
    Input,
    /// The staging of a message through host memory by CUDA-aware MPI: a device-side delay
    /// that belongs to the transfer, so breakdowns count it as communication.
    Staging,
    /// A wait for a point in time (a job's `start` on a shared fabric): neither device nor host
    /// work, so breakdowns leave it out and Monte Carlo re-timing keeps it as it was.
    Wait,
}

impl Work {
    /// Every kind of work, in order.
    pub const ALL: [Work; 6] =
        [Work::Device, Work::Launch, Work::Loader, Work::Input, Work::Staging, Work::Wait];

    /// Whether the op runs on the host rather than on the device.
    pub const fn is_host(self) -> bool {
        matches!(self, Work::Launch | Work::Loader | Work::Input)
    }

    /// Whether the op belongs to the input pipeline (a loader's work or the hand-over).
    pub const fn is_input(self) -> bool {
        matches!(self, Work::Loader | Work::Input)
    }

    /// `"device"`, `"launch"`, `"loader"`, `"input"`, `"staging"`, `"wait"`.
    pub const fn name(self) -> &'static str {
        match self {
            Work::Device => "device",
            Work::Launch => "launch",
            Work::Loader => "loader",
            Work::Input => "input",
            Work::Staging => "staging",
            Work::Wait => "wait",
        }
    }
}

/// What emitted an op (a gradient-synchronisation policy, out-of-core training, the input
/// pipeline...): an id the graph's builder interns by name ([`super::GraphBuilder::origin`]);
/// [`Origin::NONE`] for the model's own work (its layers' kernels and collectives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Origin(pub(super) u8);

impl Origin {
    /// Nothing in particular.
    pub const NONE: Origin = Origin(0);
    /// The most origins one graph names.
    pub const MAX: usize = 63;
}

/// What an op is for; see the [module documentation](self). Build one with
/// [`OpMeta::NONE`] and the `with_` methods:
///
/// ```
/// use sim_core::graph::{GroupKind, OpMeta, Pass, Work};
/// let meta = OpMeta::NONE.with_layer(3).with_pass(Pass::Forward).with_group(GroupKind::Tensor);
/// assert_eq!((meta.layer(), meta.pass(), meta.group()), (Some(3), Some(Pass::Forward), Some(GroupKind::Tensor)));
/// assert_eq!(meta.work(), Work::Device);
/// assert_eq!(OpMeta::NONE.layer(), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpMeta {
    /// The layer index, low and high halves (`u32::MAX`: none); two halves keep the alignment
    /// at 2 so that the metadata fits in an op's padding.
    layer: [u16; 2],
    /// Bits 0-2 [`Work`], 3-5 [`Pass`] (0: none), 6-9 [`GroupKind`] (0: none), 10-15
    /// [`Origin`].
    tags: u16,
}

const WORK_SHIFT: u16 = 0;
const PASS_SHIFT: u16 = 3;
const GROUP_SHIFT: u16 = 6;
const ORIGIN_SHIFT: u16 = 10;

impl OpMeta {
    /// No metadata: device work of no layer, pass, group or origin.
    pub const NONE: OpMeta = OpMeta { layer: [u16::MAX; 2], tags: 0 };

    /// The value of the field at `shift` of `bits` bits.
    const fn field(self, shift: u16, bits: u16) -> u16 {
        (self.tags >> shift) & ((1 << bits) - 1)
    }

    /// `self` with the field at `shift` of `bits` bits set to `value`.
    const fn set(self, shift: u16, bits: u16, value: u16) -> OpMeta {
        let mask = ((1 << bits) - 1) << shift;
        OpMeta { tags: (self.tags & !mask) | ((value << shift) & mask), ..self }
    }

    /// Where its time goes.
    pub const fn work(self) -> Work {
        match self.field(WORK_SHIFT, 3) {
            1 => Work::Launch,
            2 => Work::Loader,
            3 => Work::Input,
            4 => Work::Staging,
            5 => Work::Wait,
            _ => Work::Device,
        }
    }

    /// With its time going to `work`.
    pub const fn with_work(self, work: Work) -> OpMeta {
        self.set(WORK_SHIFT, 3, work as u16)
    }

    /// The model layer it belongs to (an index into the graph's layer table).
    pub const fn layer(self) -> Option<u32> {
        let layer = (self.layer[1] as u32) << 16 | self.layer[0] as u32;
        if layer == u32::MAX { None } else { Some(layer) }
    }

    /// Belonging to layer `layer` (below `u32::MAX`).
    pub const fn with_layer(self, layer: u32) -> OpMeta {
        OpMeta { layer: [layer as u16, (layer >> 16) as u16], ..self }
    }

    /// The pass it belongs to.
    pub const fn pass(self) -> Option<Pass> {
        match self.field(PASS_SHIFT, 3) {
            1 => Some(Pass::Forward),
            2 => Some(Pass::BackwardData),
            3 => Some(Pass::BackwardWeight),
            4 => Some(Pass::Recompute),
            5 => Some(Pass::Optimizer),
            _ => None,
        }
    }

    /// Belonging to pass `pass`.
    pub const fn with_pass(self, pass: Pass) -> OpMeta {
        self.set(PASS_SHIFT, 3, pass as u16 + 1)
    }

    /// The communicator kind it talks over.
    pub const fn group(self) -> Option<GroupKind> {
        match self.field(GROUP_SHIFT, 4) {
            1 => Some(GroupKind::Tensor),
            2 => Some(GroupKind::Pipeline),
            3 => Some(GroupKind::Data),
            4 => Some(GroupKind::Context),
            5 => Some(GroupKind::Expert),
            6 => Some(GroupKind::Filter),
            7 => Some(GroupKind::Channel),
            8 => Some(GroupKind::Spatial),
            _ => None,
        }
    }

    /// Talking over a communicator of kind `group`.
    pub const fn with_group(self, group: GroupKind) -> OpMeta {
        self.set(GROUP_SHIFT, 4, group as u16 + 1)
    }

    /// What emitted it.
    pub const fn origin(self) -> Origin {
        Origin(self.field(ORIGIN_SHIFT, 6) as u8)
    }

    /// Emitted by `origin`.
    pub const fn with_origin(self, origin: Origin) -> OpMeta {
        self.set(ORIGIN_SHIFT, 6, origin.0 as u16)
    }
}

impl Default for OpMeta {
    fn default() -> Self {
        OpMeta::NONE
    }
}

impl fmt::Debug for OpMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpMeta")
            .field("work", &self.work())
            .field("layer", &self.layer())
            .field("pass", &self.pass())
            .field("group", &self.group())
            .field("origin", &self.origin().0)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips_without_touching_the_others() {
        let passes: Vec<Option<Pass>> = std::iter::once(None).chain(Pass::ALL.map(Some)).collect();
        let groups: Vec<Option<GroupKind>> = std::iter::once(None).chain(GroupKind::ALL.map(Some)).collect();
        for work in Work::ALL {
            for &pass in &passes {
                for &group in &groups {
                    for origin in [0u8, 1, 62, 63] {
                        for layer in [None, Some(0), Some(70_000), Some(u32::MAX - 1)] {
                            let mut meta = OpMeta::NONE.with_work(work).with_origin(Origin(origin));
                            if let Some(pass) = pass {
                                meta = meta.with_pass(pass);
                            }
                            if let Some(group) = group {
                                meta = meta.with_group(group);
                            }
                            if let Some(layer) = layer {
                                meta = meta.with_layer(layer);
                            }
                            assert_eq!(meta.work(), work);
                            assert_eq!(meta.pass(), pass);
                            assert_eq!(meta.group(), group);
                            assert_eq!(meta.origin(), Origin(origin));
                            assert_eq!(meta.layer(), layer);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn metadata_fits_in_an_ops_padding() {
        assert_eq!(std::mem::size_of::<OpMeta>(), 6);
        assert_eq!(std::mem::size_of::<super::super::Op>(), 32);
    }

    #[test]
    fn group_indexes_follow_the_report_order() {
        for (index, kind) in GroupKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), index);
        }
    }
}
