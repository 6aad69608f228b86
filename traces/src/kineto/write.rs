//! Writes a [`Trace`] back as Kineto JSON, one file per rank: the subset of the schema that
//! the importer reads (GPU ops with their launch calls' correlation ids, synchronizing calls,
//! `ProfilerStep#N` annotations, collective arguments as newer PyTorch writes them on NCCL
//! kernels, `deviceProperties`, `distributedInfo`). Importing the written files gives the same
//! trace back. Exact stream waits, which Kineto records as `cuda_sync` events tied to event
//! record calls, are written in a `parasimStreamWaits` top-level key that other tools ignore.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::TraceError;
use crate::model::{CallKind, CollectiveType, GpuOpKind, RankTrace, Trace};
use crate::nccl;

/// Nanoseconds as Chrome-trace microseconds (exact: f64 holds every ns count below 2^53).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The `Collective name` PyTorch writes for `kind`.
fn collective_name(kind: CollectiveType) -> Option<&'static str> {
    Some(match kind {
        CollectiveType::AllReduce => "allreduce",
        CollectiveType::ReduceScatter => "reduce_scatter",
        CollectiveType::AllGather => "allgather",
        CollectiveType::AllToAll => "all_to_all",
        CollectiveType::Broadcast => "broadcast",
        CollectiveType::Reduce => "reduce",
        CollectiveType::Barrier => "barrier",
        CollectiveType::Send => "send",
        CollectiveType::Recv => "recv",
        CollectiveType::Unknown => return None,
    })
}

/// Writes rank `rank` of `trace` as one Kineto JSON document to `out`.
pub fn write_rank(trace: &Trace, rank: &RankTrace, out: impl Write) -> Result<(), serde_json::Error> {
    let mut out = std::io::BufWriter::new(out);
    let mut events: Vec<Value> = Vec::new();
    // Correlation ids: a GPU op's is its index + 1; a non-launch call gets one past all ops.
    let mut next_correlation = rank.gpu_ops.len() as u64 + 1;
    let mut call_correlation = vec![None; rank.calls.len()];
    for (index, op) in rank.gpu_ops.iter().enumerate() {
        if let Some(call) = op.launch {
            call_correlation[call as usize] = Some(index as u64 + 1);
        }
    }
    for (index, call) in rank.calls.iter().enumerate() {
        let correlation = match (call.kind, call_correlation[index]) {
            (CallKind::Launch, Some(correlation)) => correlation,
            _ => {
                next_correlation += 1;
                next_correlation
            }
        };
        events.push(json!({
            "ph": "X", "cat": "cuda_runtime", "name": trace.name(call.name),
            "pid": 0, "tid": rank.threads[call.thread as usize],
            "ts": micros(call.start_ns), "dur": micros(call.duration_ns),
            "args": {"correlation": correlation},
        }));
    }
    for (index, op) in rank.gpu_ops.iter().enumerate() {
        let stream = rank.streams[op.stream as usize];
        let mut args = Map::new();
        args.insert("device".into(), json!(stream.device));
        args.insert("stream".into(), json!(stream.stream));
        if op.launch.is_some() {
            args.insert("correlation".into(), json!(index as u64 + 1));
        }
        let category = match &op.kind {
            GpuOpKind::Kernel => "kernel",
            GpuOpKind::Memcpy { bytes, .. } => {
                args.insert("bytes".into(), json!(bytes));
                "gpu_memcpy"
            }
            GpuOpKind::Memset { bytes } => {
                args.insert("bytes".into(), json!(bytes));
                "gpu_memset"
            }
            GpuOpKind::Collective(call) => {
                if let Some(name) = collective_name(call.kind) {
                    args.insert("Collective name".into(), json!(name));
                }
                if let Some(dtype) = &call.dtype {
                    args.insert("dtype".into(), json!(dtype));
                }
                let element = call.dtype.as_deref().and_then(nccl::dtype_bytes);
                match (call.bytes, element, call.kind) {
                    (_, _, CollectiveType::Barrier) | (None, _, _) => {}
                    (Some(bytes), Some(element), kind) if bytes % element == 0 => {
                        let key = if kind == CollectiveType::AllGather {
                            "Out msg nelems"
                        } else {
                            "In msg nelems"
                        };
                        args.insert(key.into(), json!(bytes / element));
                    }
                    (Some(bytes), _, kind) => {
                        // No usable dtype: count bytes.
                        args.insert("dtype".into(), json!("Byte"));
                        let key = if kind == CollectiveType::AllGather {
                            "Out msg nelems"
                        } else {
                            "In msg nelems"
                        };
                        args.insert(key.into(), json!(bytes));
                    }
                }
                if let Some(group) = call.group {
                    let ranks: Vec<String> =
                        trace.groups[group as usize].iter().map(|r| r.to_string()).collect();
                    args.insert("Process Group Ranks".into(), json!(format!("[{}]", ranks.join(", "))));
                }
                "kernel"
            }
        };
        events.push(json!({
            "ph": "X", "cat": category, "name": trace.name(op.name),
            "pid": stream.device, "tid": stream.stream,
            "ts": micros(op.start_ns), "dur": micros(op.duration_ns),
            "args": Value::Object(args),
        }));
    }
    for step in &rank.steps {
        events.push(json!({
            "ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{}", step.number),
            "pid": 0, "tid": rank.threads[step.thread as usize],
            "ts": micros(step.start_ns), "dur": micros(step.duration_ns),
        }));
    }
    let devices: Vec<Value> = trace
        .device
        .iter()
        .flat_map(|device| {
            (0..device.devices_per_host).map(move |id| {
                json!({
                    "id": id, "name": device.name, "totalGlobalMem": device.memory_bytes,
                    "computeMajor": device.compute_capability.0, "computeMinor": device.compute_capability.1,
                    "numSms": device.multiprocessors,
                })
            })
        })
        .collect();
    let waits: Vec<[u32; 2]> = rank.stream_waits.iter().map(|w| [w.op, w.after]).collect();

    #[derive(Serialize)]
    struct Document<'a> {
        #[serde(rename = "schemaVersion")]
        schema_version: u32,
        #[serde(rename = "deviceProperties")]
        device_properties: Vec<Value>,
        #[serde(rename = "distributedInfo")]
        distributed_info: Value,
        #[serde(rename = "baseTimeNanoseconds")]
        base_time_nanoseconds: i64,
        #[serde(rename = "parasimStreamWaits")]
        stream_waits: Vec<[u32; 2]>,
        #[serde(rename = "traceEvents")]
        trace_events: &'a [Value],
    }
    serde_json::to_writer(
        &mut out,
        &Document {
            schema_version: 1,
            device_properties: devices,
            distributed_info: json!({"backend": "nccl", "rank": rank.rank, "world_size": trace.world_size}),
            base_time_nanoseconds: rank.origin_ns,
            stream_waits: waits,
            trace_events: &events,
        },
    )?;
    out.flush().map_err(serde_json::Error::io)
}

/// Writes every rank of `trace` as Kineto JSON: to `out` itself when the trace has one rank
/// and `out` is not a directory, else into directory `out` as `rank00000.json`, ... (created
/// if missing), each through a temporary name ([`crate::atomic`]). Returns the files written.
pub fn write_trace_files(trace: &Trace, out: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let as_directory =
        out.is_dir() || out.as_os_str().to_string_lossy().ends_with('/') || trace.ranks.len() > 1;
    if as_directory && out.extension().is_some_and(|e| e == "json") && !out.is_dir() {
        return Err(TraceError::Meaningless {
            path: out.to_path_buf(),
            reason: format!(
                "the trace has {} ranks and Kineto JSON holds one rank per file: give a directory to write them into",
                trace.ranks.len()
            ),
        });
    }
    let mut written = Vec::new();
    if as_directory {
        fs_err::create_dir_all(out).map_err(|e| TraceError::io(out, e))?;
    }
    for rank in &trace.ranks {
        let path =
            if as_directory { out.join(format!("rank{:05}.json", rank.rank)) } else { out.to_path_buf() };
        crate::atomic::write_with(&path, |file| write_rank(trace, rank, file).map_err(std::io::Error::other))
            .map_err(|e| TraceError::io(&path, e))?;
        written.push(path);
    }
    Ok(written)
}
