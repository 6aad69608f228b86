//! What kind of trace a file is (by its content, not its name), unpacking `.tar`, `.tar.gz`
//! and `.tgz` archives, and reading Chakra protobuf `.et` files.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::schema::{self, CollectiveCommType, NodeType};
use super::{CommNode, ComputeWork, EtNode, Role};
use crate::error::TraceError;
use crate::model::CollectiveType;
use crate::warnings::Warnings;

/// The kind of a trace file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// PyTorch profiler (Kineto) JSON.
    Kineto,
    /// parasim's binary `.pstrace`.
    Pstrace,
    /// PyTorch execution trace JSON, with its `schema`.
    PytorchEt {
        /// The `schema` field ("1.0.1", "1.1.0-chakra.0.0.4").
        schema: String,
    },
    /// Chakra JSON (`workload_graph`).
    ChakraJson,
    /// Chakra protobuf (`.et`), with its metadata's version.
    ChakraProtobuf {
        /// `GlobalMetadata.version`.
        version: String,
    },
    /// A tar archive (plain or gzipped).
    Archive,
    /// Something else, described.
    Other(String),
}

impl Format {
    /// How reports and errors name it.
    pub fn describe(&self) -> String {
        match self {
            Format::Kineto => "a PyTorch profiler (Kineto) trace".into(),
            Format::Pstrace => "a parasim binary trace (.pstrace)".into(),
            Format::PytorchEt { schema } => format!("a PyTorch execution trace (schema {schema})"),
            Format::ChakraJson => "a Chakra JSON trace (workload_graph)".into(),
            Format::ChakraProtobuf { version } => {
                format!("a Chakra protobuf execution trace (version {version})")
            }
            Format::Archive => "a tar archive".into(),
            Format::Other(what) => what.clone(),
        }
    }

    /// True for the execution-trace formats ([`super::read`] reads them).
    pub fn is_execution_trace(&self) -> bool {
        matches!(self, Format::PytorchEt { .. } | Format::ChakraJson | Format::ChakraProtobuf { .. })
    }
}

/// The first `limit` bytes of `path`, decompressed if gzipped.
fn head(path: &Path, limit: usize) -> Result<Vec<u8>, TraceError> {
    let reader = crate::kineto::raw::open(path)?;
    let mut out = Vec::with_capacity(limit);
    // A truncated or corrupt gzip stream reads as far as it goes; the parser reports it.
    let _ = reader.take(limit as u64).read_to_end(&mut out);
    Ok(out)
}

/// The kind of the trace file at `path`, from its content.
pub fn sniff(path: &Path) -> Result<Format, TraceError> {
    if crate::binary::has_magic(path) {
        return Ok(Format::Pstrace);
    }
    let bytes = head(path, 1 << 16)?;
    if bytes.len() > 262 && &bytes[257..262] == b"ustar" {
        return Ok(Format::Archive);
    }
    let text = String::from_utf8_lossy(&bytes);
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        return Ok(Format::Kineto);
    }
    if trimmed.starts_with('{') {
        if text.contains("\"traceEvents\"") {
            return Ok(Format::Kineto);
        }
        if text.contains("\"workload_graph\"") {
            return Ok(Format::ChakraJson);
        }
        // An execution trace starts with its `schema`, then `nodes` (a Kineto trace has
        // `schemaVersion`, never `schema`).
        if text.contains("\"schema\"") && (text.contains("\"nodes\"") || bytes.len() < 1 << 16) {
            let schema = schema_field(&text).unwrap_or_else(|| "not recorded".into());
            return Ok(Format::PytorchEt { schema });
        }
        // A large Kineto header can push `traceEvents` past the sniffed bytes.
        return Ok(Format::Kineto);
    }
    if let Ok(metadata) =
        <schema::GlobalMetadata as prost::Message>::decode_length_delimited(bytes.as_slice())
        && !metadata.version.is_empty()
        && metadata.version.chars().all(|c| c.is_ascii_graphic())
    {
        return Ok(Format::ChakraProtobuf { version: metadata.version });
    }
    if bytes.is_empty() {
        return Ok(Format::Other("an empty file".into()));
    }
    let shown: String = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
    Ok(Format::Other(format!("not a trace parasim reads (it starts with bytes {shown})")))
}

/// `"schema": "..."` from the start of a JSON text.
fn schema_field(text: &str) -> Option<String> {
    let at = text.find("\"schema\"")?;
    let rest = text[at + 8..].trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// An archive unpacked into a temporary folder (deleted when dropped).
#[derive(Debug)]
pub struct Unpacked {
    /// The folder.
    pub dir: tempfile::TempDir,
    /// The regular files it held (macOS `._` resource forks left out), in name order.
    pub files: Vec<PathBuf>,
}

/// Unpacks the tar archive (plain or gzipped) at `path`.
pub fn unpack(path: &Path) -> Result<Unpacked, TraceError> {
    let dir = tempfile::Builder::new()
        .prefix("parasim-trace-")
        .tempdir()
        .map_err(|e| TraceError::io(std::env::temp_dir(), e))?;
    let reader = crate::kineto::raw::open(path)?;
    let mut archive = tar::Archive::new(reader);
    let mut files = Vec::new();
    let entries = archive.entries().map_err(|e| TraceError::io(path, e))?;
    for (index, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| TraceError::io(path, e))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(|e| TraceError::io(path, e))?.into_owned();
        let base = name.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        if base.starts_with("._") || base.is_empty() {
            continue;
        }
        // Flattened, numbered: member paths never leave the folder.
        let target = dir.path().join(format!("{index:05}-{base}"));
        let mut file = fs_err::File::create(&target).map_err(|e| TraceError::io(&target, e))?;
        std::io::copy(&mut entry, &mut file).map_err(|e| TraceError::io(path, e))?;
        files.push((base, target));
    }
    files.sort();
    Ok(Unpacked { dir, files: files.into_iter().map(|(_, p)| p).collect() })
}

/// The name a member of an unpacked archive had.
pub fn member_name(path: &Path) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    match name.split_once('-') {
        Some((number, rest)) if number.len() == 5 && number.chars().all(|c| c.is_ascii_digit()) => {
            rest.to_string()
        }
        _ => name,
    }
}

fn comm_type(value: i128) -> Option<CollectiveType> {
    let kind = CollectiveCommType::try_from(i32::try_from(value).ok()?).ok()?;
    Some(match kind {
        CollectiveCommType::AllReduce => CollectiveType::AllReduce,
        CollectiveCommType::Reduce => CollectiveType::Reduce,
        CollectiveCommType::AllGather => CollectiveType::AllGather,
        CollectiveCommType::Broadcast => CollectiveType::Broadcast,
        CollectiveCommType::AllToAll => CollectiveType::AllToAll,
        CollectiveCommType::ReduceScatter | CollectiveCommType::ReduceScatterBlock => {
            CollectiveType::ReduceScatter
        }
        CollectiveCommType::Barrier => CollectiveType::Barrier,
        CollectiveCommType::Gather | CollectiveCommType::Scatter => CollectiveType::Unknown,
    })
}

/// ASTRA-sim's communicator groups beside a `.et` file (`comm_group.json`: group name -> global
/// ranks), if present.
fn comm_groups(path: &Path) -> Result<std::collections::BTreeMap<String, Vec<u32>>, TraceError> {
    let Some(file) = path.parent().map(|d| d.join("comm_group.json")).filter(|f| f.is_file()) else {
        return Ok(Default::default());
    };
    let text = fs_err::read_to_string(&file).map_err(|e| TraceError::io(&file, e))?;
    serde_json::from_str(&text).map_err(|e| TraceError::Json {
        path: file.clone(),
        context: "the communicator groups (an object of group name -> list of ranks)".into(),
        message: e.to_string(),
    })
}

/// Reads a Chakra protobuf `.et` file; returns its nodes and the largest group it names.
pub(super) fn read_protobuf(path: &Path, warnings: &mut Warnings) -> Result<(Vec<EtNode>, u32), TraceError> {
    let mut bytes = Vec::new();
    crate::kineto::raw::open(path)?.read_to_end(&mut bytes).map_err(|e| TraceError::io(path, e))?;
    let file = schema::decode(&bytes).map_err(|reason| TraceError::Meaningless {
        path: path.to_path_buf(),
        reason: format!("not a valid Chakra protobuf execution trace: {reason}"),
    })?;
    let groups = comm_groups(path)?;
    let mut largest = groups.values().map(|g| g.len() as u32).max().unwrap_or(1);
    let npus = file.metadata.attr.iter().find(|a| a.name == "npus").and_then(schema::AttributeProto::as_i128);
    if let Some(n) = npus.and_then(|n| u32::try_from(n).ok()) {
        largest = largest.max(n);
    }
    let mut out = Vec::with_capacity(file.nodes.len());
    for node in &file.nodes {
        let attr_int = |name: &str| node.attribute(name).and_then(schema::AttributeProto::as_i128);
        let attr_f64 = |name: &str| node.attribute(name).and_then(schema::AttributeProto::as_f64);
        let cpu = attr_int("is_cpu_op").is_some_and(|v| v != 0);
        let node_type = NodeType::try_from(node.r#type).unwrap_or(NodeType::InvalidNode);
        let role = match node_type {
            NodeType::CompNode => Role::Compute(ComputeWork {
                dims: Vec::new(),
                types: Vec::new(),
                flops: attr_f64("num_ops"),
                bytes: attr_f64("tensor_size"),
                host: cpu,
            }),
            _ if cpu => Role::Host,
            NodeType::CommCollNode | NodeType::CommSendNode | NodeType::CommRecvNode => {
                let kind = match node_type {
                    NodeType::CommSendNode => CollectiveType::Send,
                    NodeType::CommRecvNode => CollectiveType::Recv,
                    _ => attr_int("comm_type").and_then(comm_type).unwrap_or(CollectiveType::Unknown),
                };
                let bytes = attr_int("comm_size").and_then(|b| u64::try_from(b).ok()).filter(|&b| b > 0);
                let group = match node.attribute("pg_name").and_then(schema::AttributeProto::as_str) {
                    Some(name) => match groups.get(name) {
                        Some(members) => Some(members.clone()),
                        None => {
                            warnings.add("Chakra nodes naming a pg_name not in comm_group.json (taken as the whole world)");
                            None
                        }
                    },
                    None => None,
                };
                let peer = match node_type {
                    NodeType::CommSendNode => attr_int("comm_dst"),
                    NodeType::CommRecvNode => attr_int("comm_src"),
                    _ => None,
                }
                .and_then(|p| u32::try_from(p).ok());
                Role::Comm(CommNode { kind, bytes, group, peer })
            }
            _ => {
                warnings.add("Chakra nodes of other types (memory, metadata: not replayed)");
                Role::Host
            }
        };
        // parasim's exports also record the exact duration; Chakra's own field is in whole µs.
        let exact = attr_int("parasim_duration_ns").and_then(|d| u64::try_from(d).ok());
        let duration_ns =
            exact.or((node.duration_micros > 0).then(|| node.duration_micros.saturating_mul(1000)));
        let exact_start = attr_int("parasim_start_ns").and_then(|d| u64::try_from(d).ok());
        let start_ns = exact_start.or(Some(node.start_time_micros.saturating_mul(1000)));
        let mut deps = node.ctrl_deps.clone();
        deps.extend(&node.data_deps);
        let stream = attr_int("parasim_stream").and_then(|s| u32::try_from(s).ok());
        out.push(EtNode {
            id: node.id,
            name: node.name.clone(),
            parent: None,
            deps,
            role,
            start_ns,
            duration_ns,
            stream,
        });
    }
    Ok((out, largest))
}
