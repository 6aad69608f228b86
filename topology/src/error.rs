//! The one error type of the crate.

use crate::HostId;
use crate::spec::Routing;

/// A topology could not be built or queried. Messages name the parameter and say what is
/// valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A count that must be positive is zero.
    #[error("{what} must be at least 1, got 0")]
    Zero {
        /// Which count.
        what: &'static str,
    },
    /// A parameter has a value the topology cannot be built with.
    #[error("invalid {parameter}: {problem}")]
    Invalid {
        /// The parameter, as the scenario file names it.
        parameter: &'static str,
        /// What is wrong and what would be valid.
        problem: String,
    },
    /// The routing does not apply to the fabric.
    #[error("routing \"{routing}\" does not apply to a {fabric}; valid: {valid}")]
    UnsupportedRouting {
        /// The routing asked for.
        routing: Routing,
        /// The fabric's name.
        fabric: &'static str,
        /// The routings it takes.
        valid: String,
    },
    /// The fabric has fewer terminal positions than the cluster has NICs.
    #[error(
        "the {fabric} has room for {capacity} terminals (NICs), but the cluster needs {needed} \
         (nodes x NICs per node): use a larger fabric or fewer nodes"
    )]
    TooFewTerminals {
        /// The fabric, described.
        fabric: String,
        /// Its terminal positions.
        capacity: u64,
        /// NICs in the cluster.
        needed: u64,
    },
    /// The graph would be unreasonably large.
    #[error("the topology would have {links} links, more than the {max} parasim builds; check the sizes")]
    TooLarge {
        /// Directed links asked for.
        links: u64,
        /// The limit.
        max: u64,
    },
    /// The cluster has more hosts than a `HostId` can number.
    #[error("{nodes} nodes x {gpus_per_node} GPUs is more hosts than parasim can number (at most {max})")]
    TooManyHosts {
        /// Servers asked for.
        nodes: u32,
        /// GPUs per server asked for.
        gpus_per_node: u32,
        /// The limit.
        max: u64,
    },
    /// A host id past the end.
    #[error("{host} does not exist: the topology has {hosts} hosts")]
    UnknownHost {
        /// The id asked for.
        host: HostId,
        /// How many there are.
        hosts: usize,
    },
    /// No path connects two hosts.
    #[error("no path from {src} to {dst}")]
    Unreachable {
        /// Source.
        src: HostId,
        /// Destination.
        dst: HostId,
    },
    /// A route is longer than a [`crate::Route`] holds.
    #[error(
        "the route from {src} to {dst} needs more than {max} links, the longest route parasim handles; \
         use a fabric of smaller diameter (fewer routers along a ring or torus dimension)"
    )]
    RouteTooLong {
        /// Source.
        src: HostId,
        /// Destination.
        dst: HostId,
        /// The limit.
        max: usize,
    },
}
