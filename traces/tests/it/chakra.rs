//! Execution traces: the real PyTorch ET, Chakra JSON and Chakra protobuf files of
//! `../shared/data/traces`, read with the counts PROVENANCE.md gives; the protobuf schema
//! round trip; files of other kinds named by their kind.

use std::path::PathBuf;

use traces::et::files::{Format, sniff, unpack};
use traces::et::schema::{self, AttributeProto, EtFile, GlobalMetadata, Node, NodeType};
use traces::et::{EtJob, Role, read};
use traces::model::{CollectiveType, GpuOpKind};

use crate::common::{scratch, shared};

fn read_one(path: &std::path::Path) -> EtJob {
    let format = sniff(path).unwrap();
    assert!(format.is_execution_trace(), "{}: {format:?}", path.display());
    read(&[(path.to_path_buf(), path.display().to_string())], &format).unwrap()
}

fn comm(job: &EtJob) -> Vec<&traces::et::CommNode> {
    job.ranks[0]
        .nodes
        .iter()
        .filter_map(|n| match &n.role {
            Role::Comm(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn resnet_2gpu_et_has_its_14392_nodes_and_collectives_with_sizes() {
    let path = shared("param/et_replay/tests/inputs/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz");
    assert_eq!(sniff(&path).unwrap(), Format::PytorchEt { schema: "1.1.0-chakra.0.0.4".into() });
    let job = read_one(&path);
    assert_eq!(job.node_count(), 14_392);
    // pg_size 2 in every record_param_comms.
    assert_eq!(job.world_size, 2);
    let comms = comm(&job);
    let count = |kind| comms.iter().filter(|c| c.kind == kind).count();
    assert_eq!((count(CollectiveType::AllReduce), count(CollectiveType::Broadcast)), (15, 6));
    // The first broadcast: a float tensor of 53,120 elements (its record_param_comms says
    // in_msg_nelems 53120, dtype Float).
    let first = comms.iter().find(|c| c.kind == CollectiveType::Broadcast).unwrap();
    assert_eq!(first.bytes, Some(53_120 * 4));
    assert_eq!(first.group, Some(vec![0, 1]));
    let steps: Vec<u64> = job.ranks[0]
        .nodes
        .iter()
        .filter_map(|n| if let Role::Step(s) = n.role { Some(s) } else { None })
        .collect();
    assert_eq!(steps, [4, 5, 6]);
}

#[test]
fn chakra_1_0_2_has_263_nodes_and_10_allgathers_of_the_whole_group() {
    let archive = shared("chakra/tests/data/1.0.2-chakra.0.0.4.tgz");
    assert_eq!(sniff(&archive).unwrap(), Format::Archive);
    let unpacked = unpack(&archive).unwrap();
    // The macOS resource fork `._1.0.2-chakra.0.0.4.json` is left out.
    assert_eq!(unpacked.files.len(), 1);
    let job = read_one(&unpacked.files[0]);
    assert_eq!(job.node_count(), 263);
    let comms = comm(&job);
    assert_eq!(comms.len(), 10);
    // Each all_gather gathers one float from each of the 2 ranks: a full buffer of 8 bytes.
    assert!(comms.iter().all(|c| c.kind == CollectiveType::AllGather && c.bytes == Some(8)), "{comms:?}");
    assert_eq!(job.world_size, 2);
    // The name's `0.0.4` is a version, not a rank.
    assert_eq!(job.ranks[0].rank, 0);
}

#[test]
fn dlrm_pytorch_et_is_eight_ranks_of_1675_nodes() {
    let unpacked = unpack(&shared("param/et_replay/tests/inputs/dlrm_pytorch_et.tar.gz")).unwrap();
    let files: Vec<(PathBuf, String)> =
        unpacked.files.iter().map(|p| (p.clone(), traces::et::files::member_name(p))).collect();
    let format = sniff(&files[0].0).unwrap();
    assert_eq!(format, Format::PytorchEt { schema: "1.0.1".into() });
    let job = read(&files, &format).unwrap();
    let ranks: Vec<u32> = job.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, (0..8).collect::<Vec<_>>());
    assert_eq!(job.ranks[0].nodes.len(), 1675);
    let comms = comm(&job);
    let count = |kind| comms.iter().filter(|c| c.kind == kind).count();
    assert_eq!((count(CollectiveType::AllToAll), count(CollectiveType::AllReduce)), (5, 3));
    assert!(comms.iter().all(|c| c.bytes.is_some_and(|b| b > 0)));
}

#[test]
fn chakra_json_workload_graph_keeps_runtimes_and_nccl_kernels() {
    let unpacked = unpack(&shared("chakra/tests/data/json_trace.tar.gz")).unwrap();
    let small = unpacked.files.iter().find(|p| p.to_string_lossy().ends_with("small_chakra.0.json")).unwrap();
    assert_eq!(sniff(small).unwrap(), Format::ChakraJson);
    let job = read_one(small);
    assert_eq!(job.node_count(), 7);
    assert_eq!(job.world_size, 8, "ngpus");
    // The NCCL broadcast kernel (NodeType 7, not a CPU op), 28 us.
    let kernel = job.ranks[0].nodes.iter().find(|n| n.id == 435).unwrap();
    assert!(matches!(&kernel.role, Role::Comm(c) if c.kind == CollectiveType::Broadcast));
    assert_eq!(kernel.duration_ns, Some(28_000));
    assert_eq!(kernel.deps, [434, 432, 216, 217]);
}

fn attr(name: &str, value: schema::attribute_proto::Value) -> AttributeProto {
    AttributeProto::new(name, value)
}

/// A two-rank Chakra protobuf job: compute, then an allreduce of 1 MiB that depends on it.
pub(crate) fn write_protobuf_job(dir: &std::path::Path) {
    use schema::attribute_proto::Value as V;
    for rank in 0..2u64 {
        let nodes = vec![
            Node {
                id: 1,
                name: "gemm".into(),
                r#type: NodeType::CompNode as i32,
                duration_micros: 100,
                attr: vec![attr("is_cpu_op", V::BoolVal(false)), attr("num_ops", V::Int64Val(1 << 30))],
                ..Node::default()
            },
            Node {
                id: 2,
                name: "allreduce".into(),
                r#type: NodeType::CommCollNode as i32,
                data_deps: vec![1],
                attr: vec![
                    attr("is_cpu_op", V::BoolVal(false)),
                    attr("comm_type", V::Int64Val(schema::CollectiveCommType::AllReduce as i64)),
                    attr("comm_size", V::Int64Val(1 << 20)),
                ],
                ..Node::default()
            },
        ];
        let file = EtFile { metadata: GlobalMetadata { version: "0.0.4".into(), attr: Vec::new() }, nodes };
        fs_err::write(dir.join(format!("job.{rank}.et")), schema::encode(&file)).unwrap();
    }
}

#[test]
fn protobuf_et_files_round_trip_and_load_as_a_replayable_trace() {
    let dir = scratch("chakra-protobuf");
    write_protobuf_job(&dir);
    let bytes = fs_err::read(dir.join("job.1.et")).unwrap();
    let decoded = schema::decode(&bytes).unwrap();
    assert_eq!(decoded.metadata.version, "0.0.4");
    assert_eq!(decoded.nodes.len(), 2);
    assert_eq!(decoded.nodes[1].attribute("comm_size").and_then(AttributeProto::as_i128), Some(1 << 20));
    assert_eq!(sniff(&dir.join("job.0.et")).unwrap(), Format::ChakraProtobuf { version: "0.0.4".into() });
    let loaded = traces::load(std::slice::from_ref(&dir)).unwrap();
    let trace = &loaded.trace;
    assert_eq!((trace.world_size, trace.ranks.len()), (2, 2));
    let rank = &trace.ranks[1];
    assert_eq!(rank.rank, 1);
    let collective = rank.gpu_ops.iter().find_map(|op| match &op.kind {
        GpuOpKind::Collective(call) => Some(call),
        _ => None,
    });
    assert_eq!(collective.map(|c| (c.kind, c.bytes)), Some((CollectiveType::AllReduce, Some(1 << 20))));
    // The allreduce waits for the compute it depends on (another stream).
    assert_eq!(rank.stream_waits.len(), 1);
    assert!(loaded.timing.unwrap().starts_with("2 compute ops timed by the trace"));
}

#[test]
fn a_truncated_et_file_is_refused_naming_the_message() {
    let dir = scratch("chakra-truncated");
    write_protobuf_job(&dir);
    let path = dir.join("job.0.et");
    let bytes = fs_err::read(&path).unwrap();
    fs_err::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let error = traces::load(&[path]).unwrap_err().to_string();
    assert!(error.contains("not a valid Chakra protobuf execution trace: node message 1 at byte"), "{error}");
}

#[test]
fn files_of_other_kinds_are_named_by_their_kind() {
    let dir = scratch("chakra-kinds");
    let text = dir.join("notes.txt");
    fs_err::write(&text, "hello world\n").unwrap();
    let error = traces::load(std::slice::from_ref(&text)).unwrap_err().to_string();
    assert!(error.contains("not a trace parasim reads (it starts with bytes 68 65 6c 6c"), "{error}");
    // An archive of two files, neither a trace.
    let archive = dir.join("two.tar");
    let mut builder = tar::Builder::new(fs_err::File::create(&archive).unwrap());
    for name in ["a.txt", "b.txt"] {
        let mut header = tar::Header::new_gnu();
        header.set_size(6);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, &b"hello\n"[..]).unwrap();
    }
    builder.finish().unwrap();
    drop(builder);
    let error = traces::load(&[archive]).unwrap_err().to_string();
    assert!(
        error.contains("a tar archive holding 2 files and no trace parasim reads: a.txt (not a trace"),
        "{error}"
    );
    // An execution trace given beside a Kineto trace.
    let et = shared("HolisticTraceAnalysis/execution_trace/benchmark_simple_add_et.json.gz");
    let kineto = shared("HolisticTraceAnalysis/execution_trace/benchmark_simple_add_trace.json.gz");
    let error = traces::load(&[et, kineto]).unwrap_err().to_string();
    assert!(error.contains("this is a PyTorch profiler (Kineto) trace, given with execution traces: give a Kineto trace of the same run with --kineto"), "{error}");
}

#[test]
fn ranks_come_from_the_number_that_ends_a_file_name() {
    let rank = |name: &str| traces::et::rank_from_name(std::path::Path::new(name));
    assert_eq!(rank("dlrm_eg_3.json"), Some(3));
    assert_eq!(rank("chakra.0.json"), Some(0));
    assert_eq!(rank("llama.12.et"), Some(12));
    assert_eq!(rank("resnet_2gpu_et.json.gz"), None);
    assert_eq!(rank("1.0.2-chakra.0.0.4.json"), None);
}
