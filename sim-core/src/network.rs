//! The seam between the executor and the network models, and the `analytical` model.
//!
//! The executor hands every data movement to a [`Network`] together with a [`Completion`]
//! token, and the network reports the token back through the [`NetContext`] when the movement
//! is done: immediately known for the analytical model, or later, after its own timer events,
//! for a flow-level model whose rates change as other flows come and go. The interface is the
//! whole contract: start a transfer, a collective or a copy; handle your own event.

use std::fmt;

use topology::{HostId, LinkSpec, Topology, TopologyError};
use units::{Bytes, SimDuration, SimTime, TimeOverflow};

use crate::collective::{CollectiveError, PathCost, analytical_time};
use crate::graph::{Collective, CollectiveId, MemcpyDirection, OpId, RankId};
use crate::queue::EventQueue;

/// What a finished data movement completes: one op, or every member op of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A transfer, copy or compute op.
    Op(OpId),
    /// All member ops of a collective.
    Collective(CollectiveId),
}

/// An event of the engine's queue: a completion, or a network model's own timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<E> {
    /// Something finished.
    Done(Completion),
    /// The network model asked to be woken up.
    Network(E),
}

/// The network model's window on the event queue.
pub struct NetContext<'q, E> {
    pub(crate) queue: &'q mut EventQueue<Event<E>>,
}

impl<E: Copy> NetContext<'_, E> {
    /// The current simulated time.
    pub fn now(&self) -> SimTime {
        self.queue.now()
    }

    /// Reports `token` done `delay` from now.
    pub fn complete_after(&mut self, delay: SimDuration, token: Completion) -> Result<(), TimeOverflow> {
        self.queue.schedule_after(delay, Event::Done(token)).map(|_| ())
    }

    /// Wakes the network model with `event` `delay` from now.
    pub fn wake_after(&mut self, delay: SimDuration, event: E) -> Result<(), TimeOverflow> {
        self.queue.schedule_after(delay, Event::Network(event)).map(|_| ())
    }
}

/// A network model could not carry out a movement.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The topology has no host for a rank, or no path between two.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A collective could not be timed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A time went past the end of representable time.
    #[error(transparent)]
    Time(#[from] TimeOverflow),
    /// A quantity was out of range.
    #[error(transparent)]
    Unit(#[from] units::UnitError),
}

/// A network model: moves data between ranks and reports when it is done.
pub trait Network {
    /// The model's own timer events (`std::convert::Infallible` if it needs none).
    type Event: Copy + fmt::Debug;

    /// The model's name in reports (`analytical`, `flow`, ...).
    fn name(&self) -> &'static str;

    /// Number of hosts; rank `r` runs on host `r`.
    fn host_count(&self) -> usize;

    /// Starts sending `bytes` from `src` to `dst`; report `token` when the last byte arrives.
    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError>;

    /// Starts `collective` over `group` (every member has arrived); report `token` when done.
    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError>;

    /// Starts a host <-> device copy on `rank`; report `token` when done.
    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        rank: RankId,
        direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError>;

    /// Handles one of the model's own events.
    fn handle(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError>;
}

/// The `analytical` fidelity: alpha-beta costs on topology paths, no contention.
///
/// A message between two ranks takes the sum of the link latencies on its path plus its size
/// over the path's bottleneck bandwidth; collectives use the closed forms of
/// [`crate::collective`]. Rank `r` runs on host `r` of the topology.
#[derive(Debug)]
pub struct AnalyticalNetwork<'t> {
    topology: &'t Topology,
    host_link: LinkSpec,
    /// Path costs from each source rank, filled the first time that rank sends.
    costs_from: Vec<Option<Box<[PathCost]>>>,
}

impl<'t> AnalyticalNetwork<'t> {
    /// An analytical model over `topology`; `host_link` is each device's link to host memory.
    pub fn new(topology: &'t Topology, host_link: LinkSpec) -> Self {
        AnalyticalNetwork { topology, host_link, costs_from: vec![None; topology.host_count()] }
    }

    /// The uncontended latency and bottleneck bandwidth from `src` to `dst`.
    pub fn path_cost(&mut self, src: RankId, dst: RankId) -> Result<PathCost, NetworkError> {
        let hosts = self.topology.host_count();
        let unknown = |rank: RankId| TopologyError::UnknownHost { host: HostId(rank.0), hosts };
        let costs = self.costs_from.get_mut(src.0 as usize).ok_or(unknown(src))?;
        if costs.is_none() {
            let paths = self.topology.paths_from(HostId(src.0))?;
            let computed = paths
                .iter()
                .map(|path| {
                    let mut latency = SimDuration::ZERO;
                    let mut bandwidth = self.host_link.bandwidth;
                    // An empty path (to itself) costs nothing and runs at memory speed; the
                    // host-link bandwidth is just a placeholder that is never the bottleneck.
                    for (index, &link) in path.iter().enumerate() {
                        let link = self.topology.link(link);
                        latency = latency.checked_add(link.latency)?;
                        bandwidth = if index == 0 { link.bandwidth } else { bandwidth.min(link.bandwidth) };
                    }
                    Ok(PathCost { latency, bandwidth })
                })
                .collect::<Result<Box<[PathCost]>, TimeOverflow>>()?;
            *costs = Some(computed);
        }
        let costs = costs.as_deref().unwrap_or_default();
        costs.get(dst.0 as usize).copied().ok_or(unknown(dst).into())
    }
}

impl Network for AnalyticalNetwork<'_> {
    type Event = std::convert::Infallible;

    fn name(&self) -> &'static str {
        "analytical"
    }

    fn host_count(&self) -> usize {
        self.topology.host_count()
    }

    fn start_transfer(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        src: RankId,
        dst: RankId,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        let time = self.path_cost(src, dst)?.time_for_share(bytes, 1)?;
        Ok(context.complete_after(time, token)?)
    }

    fn start_collective(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        collective: &Collective,
        group: &[RankId],
    ) -> Result<(), NetworkError> {
        let time =
            analytical_time(collective.kind, collective.algorithm, collective.bytes, group, |a, b| {
                self.path_cost(a, b).map_err(|error| CollectiveError::NoPath {
                    src: a,
                    dst: b,
                    reason: error.to_string(),
                })
            })?;
        Ok(context.complete_after(time, token)?)
    }

    fn start_memcpy(
        &mut self,
        context: &mut NetContext<'_, Self::Event>,
        token: Completion,
        _rank: RankId,
        _direction: MemcpyDirection,
        bytes: Bytes,
    ) -> Result<(), NetworkError> {
        let cost = PathCost { latency: self.host_link.latency, bandwidth: self.host_link.bandwidth };
        Ok(context.complete_after(cost.time_for_share(bytes, 1)?, token)?)
    }

    fn handle(
        &mut self,
        _context: &mut NetContext<'_, Self::Event>,
        event: Self::Event,
    ) -> Result<(), NetworkError> {
        match event {}
    }
}
