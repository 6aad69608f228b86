//! Readers of the JSON execution traces: PyTorch's (schema 1.0.x flat nodes with `parent`,
//! `inputs`, `input_shapes`, `input_types`; schema 1.0.2+/1.1.x `-chakra` nodes with
//! `ctrl_deps`, `inputs` {`values`, `shapes`, `types`} and `attrs`) and Chakra's JSON
//! `workload_graph`.

use std::path::Path;

use serde_json::Value;

use super::{CommNode, ComputeWork, EtNode, Role};
use crate::error::TraceError;
use crate::model::CollectiveType;
use crate::nccl;
use crate::warnings::Warnings;

fn read_json(path: &Path) -> Result<Value, TraceError> {
    let reader = crate::kineto::raw::open(path)?;
    serde_json::from_reader(reader).map_err(|e| TraceError::Json {
        path: path.to_path_buf(),
        context: "the execution trace".into(),
        message: e.to_string(),
    })
}

fn bad(path: &Path, reason: String) -> TraceError {
    TraceError::Meaningless { path: path.to_path_buf(), reason }
}

/// A node's attribute: `attrs` [{name, value}] (1.0.2+) or a top-level field (1.0.1).
fn attribute<'a>(node: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(attrs) = node.get("attrs").and_then(Value::as_array) {
        return attrs
            .iter()
            .find(|a| a.get("name").and_then(Value::as_str) == Some(name))
            .and_then(|a| a.get("value"));
    }
    node.get(name)
}

/// (values, shapes, types) of a node's inputs in either layout.
fn inputs(node: &Value) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let list = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    match node.get("inputs") {
        Some(Value::Object(io)) => (list(io.get("values")), list(io.get("shapes")), list(io.get("types"))),
        other => (list(other), list(node.get("input_shapes")), list(node.get("input_types"))),
    }
}

fn outputs_values(node: &Value) -> Vec<Value> {
    match node.get("outputs") {
        Some(Value::Object(io)) => io.get("values").and_then(Value::as_array).cloned().unwrap_or_default(),
        Some(Value::Array(values)) => values.clone(),
        _ => Vec::new(),
    }
}

/// A tensor value `[id, storage, offset, elements, element bytes, device]`.
fn tensor(value: &Value) -> Option<(u64, u64, &str)> {
    let items = value.as_array()?;
    if items.len() != 6 {
        return None;
    }
    Some((items[3].as_u64()?, items[4].as_u64()?, items[5].as_str()?))
}

/// Every tensor in `value`, nested lists included.
fn tensors<'a>(value: &'a Value, out: &mut Vec<(u64, u64, &'a str)>) {
    if let Some(t) = tensor(value) {
        out.push(t);
    } else if let Some(items) = value.as_array() {
        for item in items {
            tensors(item, out);
        }
    }
}

fn on_gpu(values: &[Value], outputs: &[Value]) -> bool {
    let mut found = Vec::new();
    for v in values.iter().chain(outputs) {
        tensors(v, &mut found);
    }
    found.iter().any(|(_, _, device)| device.starts_with("cuda"))
}

/// Kineto's spelling of an ET type: `Tensor(float)` -> `float`, `Int` -> `Scalar`,
/// `None` -> ``.
fn kineto_type(ty: &Value) -> Option<String> {
    let ty = ty.as_str()?;
    Some(if let Some(inner) = ty.strip_prefix("Tensor(").and_then(|t| t.strip_suffix(')')) {
        inner.to_string()
    } else if ty == "None" {
        String::new()
    } else if matches!(ty, "Int" | "Double" | "Bool" | "Float") {
        "Scalar".to_string()
    } else if ty.starts_with("GenericList[Tensor") {
        "TensorList".to_string()
    } else {
        ty.to_string()
    })
}

fn flat_dims(shape: &Value) -> Option<Vec<u64>> {
    shape.as_array()?.iter().map(Value::as_u64).collect()
}

/// Reads a PyTorch execution trace; returns its nodes and the largest process group it names.
pub(super) fn read_pytorch(path: &Path, warnings: &mut Warnings) -> Result<(Vec<EtNode>, u32), TraceError> {
    let root = read_json(path)?;
    let nodes = root
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "a PyTorch execution trace without a `nodes` list".into()))?;
    // Which nodes have children: only leaves launch kernels of their own.
    let parent = |n: &Value| n.get("ctrl_deps").or_else(|| n.get("parent")).and_then(Value::as_u64);
    let mut has_children = std::collections::BTreeSet::new();
    for n in nodes {
        if let (Some(p), Some(id)) = (parent(n), n.get("id").and_then(Value::as_u64))
            && p != id
        {
            has_children.insert(p);
        }
    }
    let by_id: std::collections::BTreeMap<u64, &Value> =
        nodes.iter().filter_map(|n| Some((n.get("id")?.as_u64()?, n))).collect();
    let mut out = Vec::with_capacity(nodes.len());
    let mut largest_group = 1u32;
    for (index, n) in nodes.iter().enumerate() {
        let id = n
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(path, format!("node {index} has no numeric `id`")))?;
        let name = n.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        let (values, shapes, types) = inputs(n);
        let outputs = outputs_values(n);
        let role = if let Some(number) = name.strip_prefix("ProfilerStep#").and_then(|s| s.parse().ok()) {
            Role::Step(number)
        } else if name == "record_param_comms" {
            if values.iter().any(|v| v.as_str() == Some("wait")) { Role::Wait } else { Role::Host }
        } else if let Some(kind) = name.strip_prefix("nccl:").and_then(nccl::parse_collective_name) {
            let call = parent(n)
                .and_then(|p| by_id.get(&p))
                .filter(|p| p.get("name").and_then(Value::as_str) == Some("record_param_comms"));
            let comm = comm_node(kind, &values, call.copied());
            if let Some(size) = comm.group.as_ref().map(|g| g.len() as u32).or(comm_group_size(call.copied()))
            {
                largest_group = largest_group.max(size);
            }
            if comm.bytes.is_none() {
                warnings.add("execution-trace collectives without tensor sizes (replayed as a rendezvous)");
            }
            Role::Comm(comm)
        } else if !has_children.contains(&id) && name.starts_with("aten::") && on_gpu(&values, &outputs) {
            let dims = shapes.iter().map(flat_dims).collect();
            let types = types.iter().map(kineto_type).collect();
            Role::Compute(ComputeWork { dims, types, flops: None, bytes: None, host: false })
        } else {
            Role::Host
        };
        out.push(EtNode {
            id,
            name,
            parent: parent(n).filter(|&p| p != id),
            deps: Vec::new(),
            role,
            start_ns: None,
            duration_ns: None,
            stream: None,
        });
    }
    Ok((out, largest_group))
}

/// The group size a `record_param_comms` node records: `pg_size` (1.1.x) or its last input
/// (1.0.2).
fn comm_group_size(call: Option<&Value>) -> Option<u32> {
    let call = call?;
    if let Some(size) = attribute(call, "pg_size").and_then(Value::as_u64) {
        return u32::try_from(size).ok();
    }
    let (values, _, types) = inputs(call);
    // 1.0.2: [tensors, seq, pg id, root, "all_gather", in splits, out splits, group size]
    if values.len() == 8 && types.last().and_then(Value::as_str) == Some("Int") {
        return values.last().and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()).filter(|&v| v > 0);
    }
    None
}

/// A collective's size and group from the `nccl:` node's tensors and its `record_param_comms`
/// parent.
fn comm_node(kind: CollectiveType, values: &[Value], call: Option<&Value>) -> CommNode {
    let mut found = Vec::new();
    for v in values {
        tensors(v, &mut found);
    }
    let input: Option<u64> = (!found.is_empty()).then(|| found.iter().map(|(n, b, _)| n * b).sum());
    let size = comm_group_size(call);
    let group = call.and_then(|c| {
        let start = attribute(c, "global_rank_start")?.as_u64()?;
        let stride = attribute(c, "global_rank_stride")?.as_u64()?.max(1);
        let size = u64::from(size?);
        (0..size).map(|i| u32::try_from(start + i * stride).ok()).collect::<Option<Vec<u32>>>()
    });
    // The full buffer: an allgather's is its output, every rank's input.
    let bytes = match kind {
        CollectiveType::AllGather => input.map(|b| b * u64::from(size.unwrap_or(1))),
        _ => input,
    };
    CommNode { kind, bytes: bytes.filter(|&b| b > 0), group, peer: None }
}

/// Reads a Chakra JSON `workload_graph` trace.
pub(super) fn read_chakra_json(
    path: &Path,
    warnings: &mut Warnings,
) -> Result<(Vec<EtNode>, u32), TraceError> {
    let root = read_json(path)?;
    let nodes = root
        .get("workload_graph")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "a Chakra JSON trace without a `workload_graph` list".into()))?;
    let ngpus = root.get("ngpus").and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok()).unwrap_or(1);
    let ids = |n: &Value, key: &str| -> Vec<u64> {
        n.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::with_capacity(nodes.len());
    for (index, n) in nodes.iter().enumerate() {
        let id = n
            .get("Id")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(path, format!("workload_graph entry {index} has no numeric `Id`")))?;
        let name = n.get("Name").and_then(Value::as_str).unwrap_or("").to_string();
        let node_type = n.get("NodeType").and_then(Value::as_i64).unwrap_or(0);
        let cpu = n.get("is_cpu_op").and_then(Value::as_bool).unwrap_or(false);
        let runtime_us = n.get("runtime").and_then(Value::as_f64);
        let mut deps = ids(n, "ctrlDeps");
        deps.extend(ids(n, "data_deps"));
        let role = match (node_type, cpu) {
            // CPU operators with a runtime hold their host thread: replayed on a host stream.
            (_, true) if runtime_us.is_some() => {
                Role::Compute(ComputeWork { host: true, ..ComputeWork::default() })
            }
            (_, true) => Role::Host,
            (4, false) => Role::Compute(ComputeWork::default()),
            (5..=7, false) => {
                let kind = match node_type {
                    5 => CollectiveType::Send,
                    6 => CollectiveType::Recv,
                    _ => collective_of_name(&name),
                };
                warnings.add("Chakra JSON communication nodes (no byte counts: replayed at their runtime)");
                Role::Comm(CommNode { kind, bytes: None, group: None, peer: None })
            }
            _ => {
                warnings.add("Chakra JSON nodes of other types (memory, metadata: not replayed)");
                Role::Host
            }
        };
        let duration_ns = runtime_us.filter(|r| r.is_finite() && *r >= 0.0).map(|r| (r * 1e3).round() as u64);
        out.push(EtNode { id, name, parent: None, deps, role, start_ns: None, duration_ns, stream: None });
    }
    Ok((out, ngpus))
}

/// The collective a kernel or operator name spells (`ncclKernel_Broadcast_...`,
/// `c10d::broadcast_`, `nccl:all_reduce`).
pub(super) fn collective_of_name(name: &str) -> CollectiveType {
    if nccl::is_nccl_kernel(name) {
        return nccl::parse_kernel_name(name).0;
    }
    let base = name.rsplit("::").next().unwrap_or(name);
    nccl::parse_collective_name(base).unwrap_or(CollectiveType::Unknown)
}
