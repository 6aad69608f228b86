//! Test networks for the NCCL model's unit tests: every message on its own path (no link
//! sharing), servers of a fixed size, and NCCL's tuner seeing a DGX A100 or an H100 server.

use topology::NcclSettings;
use units::{Bandwidth, Bytes, SimDuration};

use crate::collective::{PathCost, StepNetwork};
use crate::graph::RankId;
use crate::nccl::network::NcclNetwork;
use crate::nccl::protocol::ProtocolChoice;
use crate::nccl::tables::NcclVersion;
use crate::nccl::tuner::{self, GpuGeneration, TunerFabric};
use crate::schedule::CollectiveError;

/// Every message has its own path of `cost` (no sharing); `per_node` ranks per server.
pub(crate) struct Uniform {
    pub(crate) cost: PathCost,
    pub(crate) per_node: u32,
}

impl StepNetwork for Uniform {
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
        Ok(rank.0 / self.per_node)
    }
    fn step_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        let largest = messages.iter().map(|m| m.2).max().expect("a step has messages");
        let share = Bytes(bytes.0.checked_mul(largest).expect("small test sizes"));
        Ok(self.cost.time_for_share(share, den)?)
    }
}

/// NCCL's defaults: no protocols, no tuner fabric.
impl NcclNetwork for Uniform {}

/// One rank per server, every path 2 us and 100 Gb/s.
pub(crate) fn uniform() -> Uniform {
    Uniform {
        cost: PathCost { latency: SimDuration::from_us(2), bandwidth: "100 Gb/s".parse().unwrap() },
        per_node: 1,
    }
}

/// Ranks `0..p`.
pub(crate) fn ranks(p: u32) -> Vec<RankId> {
    (0..p).map(RankId).collect()
}

/// [`Uniform`] as NCCL `release`'s tuner sees a DGX-A100-like server, with a per-channel
/// cost.
pub(crate) struct Tuned {
    pub(crate) inner: Uniform,
    pub(crate) per_channel: SimDuration,
    pub(crate) device_copy: Option<Bandwidth>,
    pub(crate) release: NcclVersion,
    pub(crate) ll_rate: Option<Bandwidth>,
}

/// Eight GPUs per server on the DGX A100 tuner fabric, without channel, copy or LL host
/// costs: each test sets what it checks.
pub(crate) fn tuned() -> Tuned {
    Tuned {
        inner: Uniform { per_node: 8, ..uniform() },
        per_channel: SimDuration::ZERO,
        device_copy: None,
        release: tuner::dgx_a100().nccl,
        ll_rate: None,
    }
}

impl StepNetwork for Tuned {
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
        self.inner.node_of(rank)
    }
    fn step_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        self.inner.step_time(messages, bytes, den)
    }
}

impl NcclNetwork for Tuned {
    fn channel_overhead(&self) -> SimDuration {
        self.per_channel
    }
    fn ll_host_rate(&self) -> Option<Bandwidth> {
        self.ll_rate
    }
    fn device_copy(&self) -> Option<Bandwidth> {
        self.device_copy
    }
    fn protocols(&self) -> ProtocolChoice {
        ProtocolChoice::Auto
    }
    fn tuner_fabric(&self) -> Option<TunerFabric> {
        Some(TunerFabric { nccl: self.release, ..tuner::dgx_a100() })
    }
}

/// Two servers of 8 H100s with 8 NICs of 25 GB/s each as NCCL's tuner sees them (GCP
/// A3-Mega-like), NCCL settings `nccl`, every message on its own 1 TB/s path (far faster
/// than NCCL's per-channel tree rate), no path latency.
pub(crate) struct Hopper {
    pub(crate) inner: Uniform,
    pub(crate) nccl: NcclSettings,
}

impl StepNetwork for Hopper {
    fn node_of(&self, rank: RankId) -> Result<u32, CollectiveError> {
        self.inner.node_of(rank)
    }
    fn step_time(
        &mut self,
        messages: &[(RankId, RankId, u64)],
        bytes: Bytes,
        den: u64,
    ) -> Result<SimDuration, CollectiveError> {
        self.inner.step_time(messages, bytes, den)
    }
}

impl NcclNetwork for Hopper {
    fn protocols(&self) -> ProtocolChoice {
        ProtocolChoice::Auto
    }
    fn tuner_fabric(&self) -> Option<TunerFabric> {
        Some(TunerFabric { intra: 370.0, generation: GpuGeneration::Hopper, ..tuner::dgx_a100() })
    }
    fn nccl(&self) -> NcclSettings {
        self.nccl
    }
    fn nvls(&self) -> bool {
        true
    }
}

/// [`Hopper`] with the run's NCCL settings `nccl`.
pub(crate) fn hopper(nccl: NcclSettings) -> Hopper {
    let cost = PathCost { latency: SimDuration::ZERO, bandwidth: "8000 Gb/s".parse().unwrap() };
    Hopper { inner: Uniform { cost, per_node: 8 }, nccl }
}
