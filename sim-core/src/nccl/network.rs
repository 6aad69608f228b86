//! What the NCCL model needs from a network model beyond timing steps ([`StepNetwork`]): the
//! links inside a server, the transport's costs, the protocols to run, whether switches
//! reduce, the cluster as NCCL's tuner sees it, and the run's NCCL settings.
//!
//! Every method has a default that turns its cost off (no protocols, no per-channel or LL
//! host costs, no switch reduction, no tuner fabric), so a network model states only what it
//! knows; with every default, the NCCL model times a collective as its bare schedule plus the
//! collective launch.

use topology::NcclSettings;
use units::{Bandwidth, SimDuration};

use crate::collective::StepNetwork;
use crate::nccl::protocol::{Hop, ProtocolChoice};
use crate::nccl::tables::NcclTable;
use crate::nccl::tuner::TunerFabric;

/// What the NCCL model needs from the network besides the steps' timing (see the module
/// documentation).
pub trait NcclNetwork: StepNetwork {
    /// The links inside a server (NVLink or PCIe), for the protocols' per-hop latencies.
    fn intra_hop(&self) -> Hop {
        Hop::NvLink
    }

    /// The transport's software cost per message that crosses the network.
    fn message_overhead(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// The fixed cost of every channel a collective runs on, with protocols (see
    /// `overhead::channel_time`).
    fn channel_overhead(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// The rate at which an LL step reaches the network through host memory (see
    /// `overhead::ll_host_time`); `None` for no such cost.
    fn ll_host_rate(&self) -> Option<Bandwidth> {
        None
    }

    /// The fixed cost of every collective (with protocols: the Simple protocol's base latency).
    fn collective_launch(&self) -> SimDuration {
        SimDuration::ZERO
    }

    /// Which protocols collectives use.
    fn protocols(&self) -> ProtocolChoice {
        ProtocolChoice::Off
    }

    /// True if the servers' NVSwitches can reduce (NVLS), given a GPU generation that has it.
    fn nvls(&self) -> bool {
        false
    }

    /// True if the switches between servers reduce (InfiniBand SHARP: NCCL's CollNet).
    fn sharp(&self) -> bool {
        false
    }

    /// The cluster as NCCL's tuner sees it; `None` to choose by this network's own estimate.
    fn tuner_fabric(&self) -> Option<TunerFabric> {
        None
    }

    /// The rate at which a GPU copies a buffer within its own memory (reading and writing it:
    /// a copy of `b` bytes moves `2b`), for the copy a ring's kernel makes without crossing a
    /// link (`overhead::ring_copy_time`); `None` where the device is not known.
    fn device_copy(&self) -> Option<Bandwidth> {
        None
    }

    /// The run's NCCL settings: the algorithms and protocols `auto` may choose, and the
    /// Simple protocol's buffer (`[cluster.network] nccl-algorithms`, `nccl-protocols`,
    /// `nccl-buffsize`); NCCL's defaults unless the cluster says otherwise.
    fn nccl(&self) -> NcclSettings {
        NcclSettings::DEFAULT
    }
}

/// The NCCL release constants `network` is priced with: its tuner fabric's release, else the
/// default's.
pub(crate) fn nccl_table(network: &impl NcclNetwork) -> &'static NcclTable {
    network.tuner_fabric().map_or(NcclTable::default_table(), |fabric| fabric.table())
}
