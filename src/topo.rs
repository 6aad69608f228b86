//! `parasim topo`: describe the cluster of a scenario (counts, bisection bandwidth, diameter,
//! path lengths) as text or JSON, and optionally write it as Graphviz.

use crate::output::stderr;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use topology::{IntraNode, Topology};

use scenario::Cluster;

/// The intra-node interconnect, for `--json`.
#[derive(Debug, Serialize)]
struct IntraNodeJson {
    /// `nvswitch`, `pcie-switch` or `nvlink-mesh`.
    kind: &'static str,
    /// Per GPU (per GPU pair for a mesh), one direction.
    bandwidth_bytes_per_s: f64,
    latency_s: f64,
}

/// Route lengths between host pairs, for `--json`.
#[derive(Debug, Serialize)]
struct PathLengthsJson {
    /// `histogram[k]`: ordered host pairs whose route has `k` links.
    histogram: Vec<u64>,
    pairs: u64,
    /// Every ordered pair examined (otherwise a fixed sample).
    exact: bool,
    too_long: u64,
}

/// `parasim topo --json`: the same facts as the text, numbers in SI base units.
#[derive(Debug, Serialize)]
struct TopoJson {
    scenario: String,
    device: String,
    gpus: usize,
    nodes: u32,
    gpus_per_node: u32,
    intra_node: IntraNodeJson,
    rail_optimized: bool,
    fabric: String,
    routing: String,
    nics: usize,
    switches: usize,
    /// Directed links (two per cable).
    links: usize,
    /// One direction; null when there is nothing to cut (one GPU).
    bisection_bandwidth_bytes_per_s: Option<f64>,
    bisection_method: String,
    diameter_links: usize,
    path_lengths: PathLengthsJson,
    /// How a fat-tree larger than the NICs need was pruned; null when built whole.
    pruned: Option<String>,
    /// Every directed link, by id: the names `traffic` and `run` report links by.
    link_list: Vec<LinkJson>,
}

/// One directed link of `topo --json`'s `link_list`.
#[derive(Debug, Serialize)]
struct LinkJson {
    id: u32,
    /// `"FROM -> TO"`.
    name: String,
    /// NVLink, PCIe, NIC, leaf-spine, spine-core, local, global, ...
    kind: &'static str,
    capacity_bytes_per_s: f64,
    latency_s: f64,
}

/// The description of the cluster in `scenario` (text, or JSON with `json`); writes `dot` if
/// given.
pub fn describe(scenario: &Path, dot: Option<&Path>, json: bool) -> anyhow::Result<String> {
    let cluster = Cluster::load(scenario)?;
    let topology = Topology::build(&cluster.spec).context("building the cluster topology")?;
    let spec = &cluster.spec;
    let mut out = String::new();
    let (kind, link) = match spec.intra_node {
        IntraNode::NvSwitch(link) => ("nvswitch", link),
        IntraNode::PcieSwitch(link) => ("pcie-switch", link),
        IntraNode::NvLinkMesh(link) => ("nvlink-mesh", link),
    };
    let summary = topology.summary();
    if json {
        let report = TopoJson {
            scenario: scenario.display().to_string(),
            device: cluster.device.display_name.clone(),
            gpus: topology.host_count(),
            nodes: spec.nodes,
            gpus_per_node: spec.gpus_per_node,
            intra_node: IntraNodeJson {
                kind,
                bandwidth_bytes_per_s: link.bandwidth.bytes_per_second(),
                latency_s: link.latency.as_secs_f64(),
            },
            rail_optimized: spec.network.rail_optimized,
            fabric: summary.fabric.clone(),
            routing: summary.routing.to_string(),
            nics: summary.nics,
            switches: summary.switches,
            links: summary.links,
            bisection_bandwidth_bytes_per_s: summary.bisection.map(|b| b.bytes_per_second()),
            bisection_method: summary.bisection_method.clone(),
            diameter_links: summary.diameter,
            path_lengths: PathLengthsJson {
                histogram: summary.path_lengths.histogram.clone(),
                pairs: summary.path_lengths.pairs,
                exact: summary.path_lengths.exact,
                too_long: summary.path_lengths.too_long,
            },
            pruned: summary.pruned.clone(),
            link_list: (0..topology.link_count() as u32)
                .map(|id| {
                    let link = topology::LinkId(id);
                    LinkJson {
                        id,
                        name: topology.link_name(link),
                        kind: topology.link_kind(link),
                        capacity_bytes_per_s: topology.link(link).bandwidth.bytes_per_second(),
                        latency_s: topology.link(link).latency.as_secs_f64(),
                    }
                })
                .collect(),
        };
        out = serde_json::to_string_pretty(&report).context("writing JSON")? + "\n";
    } else {
        let noun = cluster.device.kind.noun();
        let _ = writeln!(
            out,
            "cluster       {} x {} = {} nodes x {} {noun}{}, {}",
            topology.host_count(),
            cluster.device.display_name,
            spec.nodes,
            spec.gpus_per_node,
            if spec.gpus_per_node == 1 { "" } else { "s" },
            match kind {
                // A node of one device has no link inside it to describe.
                _ if spec.gpus_per_node == 1 => format!("intra-node none (one {noun} per node)"),
                "nvswitch" => format!("NVSwitch {} {} per {noun}", link.bandwidth, link.latency),
                "pcie-switch" => format!("PCIe switch {} {} per {noun}", link.bandwidth, link.latency),
                _ => format!("NVLink mesh {} {} per {noun} pair", link.bandwidth, link.latency),
            }
        );
        if spec.network.rail_optimized {
            let _ = writeln!(out, "wiring        rail-optimized: NIC i of every node on leaf i");
        }
        let _ = write!(out, "{}", summary.describe(noun));
    }
    if let Some(path) = dot {
        traces::atomic::write(path, topology.to_dot()).context("writing the Graphviz file")?;
        let note =
            format!("wrote {} (render with: dot -Tsvg {} -o topology.svg)", path.display(), path.display());
        if json {
            stderr!("{note}");
        } else {
            let _ = writeln!(out, "{note}");
        }
    }
    Ok(out)
}
