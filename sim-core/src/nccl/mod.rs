//! The NCCL model: how NCCL runs a collective, and what that costs beyond moving its data.
//!
//! NCCL picks an algorithm and a protocol for every collective from its own latency and
//! bandwidth model, then runs the algorithm's point-to-point steps ([`crate::schedule`]) under
//! that protocol: its data shares the links by the protocol's share, and every hop, channel
//! and collective pays the protocol's latencies. This module holds that model, bottom up
//! (each file imports only from the ones above it in this list, and from below `nccl`:
//! `graph`, `schedule`, `collective`):
//!
//! - [`protocol`]: the vocabulary (protocols, hops, latency families, which protocols a
//!   network model runs, [`protocol::Choice`]: an algorithm and a protocol);
//! - [`tables`]: every NCCL constant, one table per release, and what a protocol costs under
//!   a release;
//! - [`tuner`]: NCCL's own latency/bandwidth model ([`tuner::TunerFabric`], the GPUs'
//!   [`tuner::GpuGeneration`]), with which it chooses;
//! - [`network`]: what the model asks of a network model beyond timing steps
//!   ([`network::NcclNetwork`]);
//! - [`nvls`], [`collnet`]: the in-network allreduces (reduction in the NVSwitch, in
//!   InfiniBand switches), in closed form;
//! - [`wire`]: what a choice puts on the links (wire bytes, chunks, the tree's step floor,
//!   the schedule it runs);
//! - [`overhead`]: what a choice costs beyond its data (protocol latencies, channels, LL's
//!   host-memory wait, a ring's copy inside a server, the plateau factor);
//! - [`timing`]: a collective's uncontended time under a choice (data plus overhead);
//! - [`choice`]: `auto`, the choice itself, and [`choice::analytical_time`].
//!
//! The network models (`network`, `flow`) sit above: they implement
//! [`collective::StepNetwork`](crate::collective::StepNetwork) and
//! [`network::NcclNetwork`], ask [`choice`] what runs, and time or simulate the data.

pub mod choice;
pub mod collnet;
pub mod network;
pub mod nvls;
pub mod overhead;
pub mod protocol;
pub mod tables;
#[cfg(test)]
mod testing;
pub mod timing;
pub mod tuner;
pub mod wire;
