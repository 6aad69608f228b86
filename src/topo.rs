//! `parasim topo`: describe the cluster of a scenario (counts, bisection bandwidth, diameter,
//! path lengths) and optionally write it as Graphviz.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use topology::Topology;

use workloads::scenario::Cluster;

/// The description of the cluster in `scenario`; writes `dot` if given.
pub fn describe(scenario: &Path, dot: Option<&Path>) -> anyhow::Result<String> {
    let cluster = Cluster::load(scenario)?;
    let topology = Topology::build(&cluster.spec).context("building the cluster topology")?;
    let spec = &cluster.spec;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster       {} x {} = {} nodes x {} GPUs, {}",
        topology.host_count(),
        cluster.device.display_name,
        spec.nodes,
        spec.gpus_per_node,
        match spec.intra_node {
            topology::IntraNode::NvSwitch(link) =>
                format!("NVSwitch {} {} per GPU", link.bandwidth, link.latency),
            topology::IntraNode::PcieSwitch(link) =>
                format!("PCIe switch {} {} per GPU", link.bandwidth, link.latency),
            topology::IntraNode::NvLinkMesh(link) =>
                format!("NVLink mesh {} {} per GPU pair", link.bandwidth, link.latency),
        }
    );
    if spec.network.rail_optimized {
        let _ = writeln!(out, "wiring        rail-optimized: NIC i of every node on leaf i");
    }
    let _ = write!(out, "{}", topology.summary());
    if let Some(path) = dot {
        fs_err::write(path, topology.to_dot()).context("writing the Graphviz file")?;
        let _ = writeln!(
            out,
            "wrote {} (render with: dot -Tsvg {} -o topology.svg)",
            path.display(),
            path.display()
        );
    }
    Ok(out)
}
