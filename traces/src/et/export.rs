//! Writing a simulated execution graph as Chakra protobuf execution traces: one `.et` file per
//! rank, named `NAME.RANK.et` as Chakra names them, and the communicator groups as ASTRA-sim's
//! `comm_group.json` (docs/chakra.md says what maps to what and what is lost).
//!
//! Node ids are the graph's op ids (a receive gets `ops + op id` of its send), so they are
//! unique across the files. Each node's `ctrl_deps` is the op before it on the same stream of
//! its rank (Chakra has no streams), its `data_deps` the graph's dependencies on ops of the
//! same rank; a dependency on a transfer from another rank becomes a `COMM_RECV_NODE` on the
//! receiving rank. Times are the simulation's: `start_time_micros` and `duration_micros`
//! (whole microseconds, as the schema has them), and the exact nanoseconds in the attributes
//! `parasim_start_ns` and `parasim_duration_ns`, with the op's stream in `parasim_stream`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sim_core::exec::Timeline;
use sim_core::graph::{CollectiveKind, ExecGraph, MemcpyDirection, OpId, OpKind};

use super::schema::{self, AttributeProto, CollectiveCommType, EtFile, GlobalMetadata, Node, NodeType};
use crate::error::TraceError;

/// The Chakra schema version the files declare (`GlobalMetadata.version`).
pub const CHAKRA_VERSION: &str = "0.0.4";

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportStats {
    /// The files, rank by rank.
    pub files: Vec<PathBuf>,
    /// Nodes over all files.
    pub nodes: u64,
    /// Nodes per type name (`COMP_NODE`, `COMM_COLL_NODE`, ...).
    pub by_type: BTreeMap<&'static str, u64>,
    /// FLOPs written (`num_ops`) per rank.
    pub flops: Vec<f64>,
    /// Bytes written (`comm_size`) per rank, over collectives, sends and receives.
    pub comm_bytes: Vec<u64>,
}

fn type_name(t: NodeType) -> &'static str {
    match t {
        NodeType::CompNode => "COMP_NODE",
        NodeType::CommCollNode => "COMM_COLL_NODE",
        NodeType::CommSendNode => "COMM_SEND_NODE",
        NodeType::CommRecvNode => "COMM_RECV_NODE",
        NodeType::MemLoadNode => "MEM_LOAD_NODE",
        NodeType::MemStoreNode => "MEM_STORE_NODE",
        _ => "OTHER",
    }
}

fn comm_type(kind: CollectiveKind) -> CollectiveCommType {
    match kind {
        CollectiveKind::AllReduce => CollectiveCommType::AllReduce,
        CollectiveKind::ReduceScatter => CollectiveCommType::ReduceScatter,
        CollectiveKind::AllGather => CollectiveCommType::AllGather,
        CollectiveKind::AllToAll => CollectiveCommType::AllToAll,
        CollectiveKind::Broadcast { .. } => CollectiveCommType::Broadcast,
        CollectiveKind::Reduce { .. } => CollectiveCommType::Reduce,
    }
}

fn ns(ps: u64) -> u64 {
    ps.div_ceil(1000)
}

/// Writes `graph` as simulated in `timeline` to `dir` (created if missing) as `NAME.RANK.et`
/// files and `comm_group.json`; `flops` gives each compute op's FLOPs (0 where unknown).
pub fn write_chakra(
    graph: &ExecGraph,
    timeline: &Timeline,
    flops: &dyn Fn(OpId) -> f64,
    name: &str,
    dir: &Path,
) -> Result<ExportStats, TraceError> {
    use schema::attribute_proto::Value as V;
    fs_err::create_dir_all(dir).map_err(|e| TraceError::io(dir, e))?;
    let ranks = graph.ranks() as usize;
    let ops = graph.ops();
    let offset = ops.len() as u64;
    let mut nodes: Vec<Vec<Node>> = vec![Vec::new(); ranks];
    let mut last_on_stream: BTreeMap<(u32, u16), u64> = BTreeMap::new();
    let mut stats =
        ExportStats { flops: vec![0.0; ranks], comm_bytes: vec![0; ranks], ..ExportStats::default() };
    // Receives are written when their transfer is: the receiving rank's node.
    let time = |op: usize| {
        let start = ns(timeline.start.get(op).map_or(0, |t| t.as_ps()));
        let end = ns(timeline.end.get(op).map_or(0, |t| t.as_ps()));
        (start, end.saturating_sub(start))
    };
    let timed = |node: &mut Node, start: u64, duration: u64, stream: u16| {
        node.start_time_micros = start / 1000;
        node.duration_micros = duration.div_ceil(1000);
        node.attr.push(AttributeProto::new("parasim_start_ns", V::Uint64Val(start)));
        node.attr.push(AttributeProto::new("parasim_duration_ns", V::Uint64Val(duration)));
        node.attr.push(AttributeProto::new("parasim_stream", V::Uint32Val(u32::from(stream))));
    };
    for (index, op) in ops.iter().enumerate() {
        let id = OpId(index as u32);
        let rank = op.rank.0 as usize;
        let mut node = Node { id: index as u64, name: graph.label(op.label).to_string(), ..Node::default() };
        if let Some(&previous) = last_on_stream.get(&(op.rank.0, op.stream.0)) {
            node.ctrl_deps.push(previous);
        }
        last_on_stream.insert((op.rank.0, op.stream.0), index as u64);
        for dep in graph.deps(id) {
            let dep_op = graph.op(*dep);
            if dep_op.rank == op.rank {
                node.data_deps.push(u64::from(dep.0));
            } else if let OpKind::Transfer { dst, .. } = dep_op.kind
                && dst == op.rank
            {
                node.data_deps.push(offset + u64::from(dep.0));
            }
        }
        node.data_deps.sort_unstable();
        node.data_deps.dedup();
        let (start, duration) = time(index);
        let host = op.meta.work().is_host();
        let node_type = match op.kind {
            OpKind::Compute { .. } => {
                let f = flops(id);
                node.attr.push(AttributeProto::new("is_cpu_op", V::BoolVal(host)));
                node.attr.push(AttributeProto::new("num_ops", V::Int64Val(f.round() as i64)));
                stats.flops[rank] += f.round();
                NodeType::CompNode
            }
            OpKind::Collective(c) => {
                let collective = graph.collective(c);
                node.attr.push(AttributeProto::new("is_cpu_op", V::BoolVal(false)));
                node.attr
                    .push(AttributeProto::new("comm_type", V::Int64Val(comm_type(collective.kind) as i64)));
                node.attr.push(AttributeProto::new("comm_size", V::Int64Val(collective.bytes.0 as i64)));
                node.attr.push(AttributeProto::new("pg_name", V::StringVal(collective.group.0.to_string())));
                if let CollectiveKind::Broadcast { root } | CollectiveKind::Reduce { root } = collective.kind
                {
                    node.attr.push(AttributeProto::new("root", V::Int64Val(i64::from(root))));
                }
                stats.comm_bytes[rank] += collective.bytes.0;
                NodeType::CommCollNode
            }
            OpKind::Transfer { dst, bytes } => {
                node.attr.push(AttributeProto::new("is_cpu_op", V::BoolVal(false)));
                node.attr.push(AttributeProto::new("comm_size", V::Int64Val(bytes.0 as i64)));
                node.attr.push(AttributeProto::new("comm_src", V::Int32Val(op.rank.0 as i32)));
                node.attr.push(AttributeProto::new("comm_dst", V::Int32Val(dst.0 as i32)));
                node.attr.push(AttributeProto::new("comm_tag", V::Int64Val(index as i64)));
                stats.comm_bytes[rank] += bytes.0;
                let mut recv = Node {
                    id: offset + index as u64,
                    name: format!("recv {}", graph.label(op.label)),
                    r#type: NodeType::CommRecvNode as i32,
                    ..Node::default()
                };
                recv.attr.push(AttributeProto::new("is_cpu_op", V::BoolVal(false)));
                recv.attr.push(AttributeProto::new("comm_size", V::Int64Val(bytes.0 as i64)));
                recv.attr.push(AttributeProto::new("comm_src", V::Int32Val(op.rank.0 as i32)));
                recv.attr.push(AttributeProto::new("comm_dst", V::Int32Val(dst.0 as i32)));
                recv.attr.push(AttributeProto::new("comm_tag", V::Int64Val(index as i64)));
                timed(&mut recv, start, duration, u16::MAX);
                stats.comm_bytes[dst.0 as usize] += bytes.0;
                *stats.by_type.entry(type_name(NodeType::CommRecvNode)).or_default() += 1;
                nodes[dst.0 as usize].push(recv);
                NodeType::CommSendNode
            }
            OpKind::Memcpy { direction, bytes } => {
                node.attr.push(AttributeProto::new("is_cpu_op", V::BoolVal(false)));
                node.attr.push(AttributeProto::new("tensor_size", V::Uint64Val(bytes.0)));
                match direction {
                    MemcpyDirection::HostToDevice => NodeType::MemLoadNode,
                    MemcpyDirection::DeviceToHost => NodeType::MemStoreNode,
                }
            }
        };
        node.r#type = node_type as i32;
        timed(&mut node, start, duration, op.stream.0);
        *stats.by_type.entry(type_name(node_type)).or_default() += 1;
        nodes[rank].push(node);
    }
    // comm_group.json: every group a collective uses, by its id.
    let mut groups: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for collective in graph.collectives() {
        groups
            .entry(collective.group.0.to_string())
            .or_insert_with(|| graph.group(collective.group).iter().map(|r| r.0).collect());
    }
    let groups_path = dir.join("comm_group.json");
    let text = serde_json::to_string_pretty(&groups).map_err(|e| TraceError::Json {
        path: groups_path.clone(),
        context: "writing the communicator groups".into(),
        message: e.to_string(),
    })?;
    crate::atomic::write(&groups_path, text + "\n").map_err(|e| TraceError::io(&groups_path, e))?;
    for (rank, mut rank_nodes) in nodes.into_iter().enumerate() {
        rank_nodes.sort_by_key(|n| n.id);
        stats.nodes += rank_nodes.len() as u64;
        let metadata = GlobalMetadata {
            version: CHAKRA_VERSION.into(),
            attr: vec![
                AttributeProto::new("schema", V::StringVal(format!("{CHAKRA_VERSION}-parasim"))),
                AttributeProto::new("npus", V::Uint64Val(ranks as u64)),
                AttributeProto::new("rank", V::Uint64Val(rank as u64)),
            ],
        };
        let path = dir.join(format!("{name}.{rank}.et"));
        let bytes = schema::encode(&EtFile { metadata, nodes: rank_nodes });
        crate::atomic::write(&path, bytes).map_err(|e| TraceError::io(&path, e))?;
        stats.files.push(path);
    }
    Ok(stats)
}
