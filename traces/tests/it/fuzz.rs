//! Mutation fuzzing of the trace readers (docs/fuzzing.md), with the workspace's one mutation
//! engine (the `fuzzing` crate): valid inputs with bytes or characters replaced, deleted,
//! inserted or duplicated give a result or an error, never a panic, a hang or a runaway
//! allocation. The case-count properties run 128 cases in `cargo test` (`PROPTEST_CASES=N` for
//! more); the time-budgeted targets (`trace_json_files`, `trace_binary_files`) run for
//! `FUZZ_SECONDS` and also require errors that name the file.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use fuzzing::{Campaign, byte_edits, mutate, names_one_of};
use proptest::prelude::*;
use traces::synthetic::SyntheticJob;

use crate::common::scratch;

fn small_job() -> SyntheticJob {
    SyntheticJob { world_size: 1, steps: 2, layers: 6, layers_per_bucket: 3, ..SyntheticJob::default() }
}

fn kineto_seed() -> Vec<u8> {
    let mut bytes = Vec::new();
    small_job().write_rank(0, &mut bytes).unwrap();
    bytes
}

/// The seed trace as `.pstrace`, converted in the scratch folder `folder` (one per test: tests
/// run side by side and a scratch folder is emptied when taken).
fn pstrace_seed(folder: &str) -> Vec<u8> {
    let dir = scratch(folder);
    let json = dir.join("rank0.json");
    fs_err::write(&json, kineto_seed()).unwrap();
    let trace = traces::load(std::slice::from_ref(&json)).unwrap().trace;
    traces::binary::to_bytes(&trace).unwrap()
}

const NCCL_LOG: &str = "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20\n\
#  Rank  0 Group  0 Pid   1 on host device  0 [0x07] A100\n\
#  Rank  1 Group  0 Pid   2 on host device  1 [0x0b] A100\n\
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
           8             2     float     sum      -1    10.00    0.00    0.00      0    10.00    0.00    0.00      0\n\
        1024           256     float     sum      -1    12.00    0.09    0.09      0    12.00    0.09    0.09      0\n\
# Avg bus bandwidth    : 0.04\n";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn kineto_import_never_panics(edits in byte_edits()) {
        let dir = scratch("fuzz-kineto");
        let path = dir.join("rank0.json");
        fs_err::write(&path, mutate(&kineto_seed(), &edits, &[])).unwrap();
        let _ = traces::kineto::import(std::slice::from_ref(&path));
        let _ = traces::load(std::slice::from_ref(&path));
    }

    #[test]
    fn pstrace_decoding_never_panics(edits in byte_edits()) {
        let mutated = mutate(&pstrace_seed("fuzz-pstrace-seed"), &edits, &[]);
        if let Err(error) = traces::binary::from_bytes(&mutated, Path::new("fuzz.pstrace")) {
            prop_assert!(error.to_string().contains("fuzz.pstrace"), "{}", error);
        }
    }

    #[test]
    fn nccl_tests_parsing_never_panics(edits in byte_edits()) {
        let mutated = mutate(NCCL_LOG.as_bytes(), &edits, &[]);
        let text = String::from_utf8_lossy(&mutated);
        let _ = traces::nccl::parse_tests_output(&text, Path::new("fuzz.log"));
    }
}

/// The decompressed members of a shared `.tar.gz` or `.tgz` (the shared data folder beside the
/// checkout) whose names end with `suffix`, at most 200 kB each; none if the folder is missing.
fn shared_members(archive: &str, suffix: &str) -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/traces").join(archive);
    let Ok(file) = fs_err::File::open(&path) else { return Vec::new() };
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut found = Vec::new();
    let Ok(entries) = archive.entries() else { return found };
    for mut entry in entries.flatten() {
        let name = entry.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let base = name.rsplit('/').next().unwrap_or_default();
        if base.ends_with(suffix) && !base.starts_with("._") && entry.size() <= 200_000 {
            let mut bytes = Vec::new();
            if std::io::Read::read_to_end(&mut entry, &mut bytes).is_ok() {
                found.push(bytes);
            }
        }
    }
    found
}

/// A shared `.json.gz` decompressed, if it is there and at most 200 kB.
fn shared_gz(relative: &str) -> Option<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/traces").join(relative);
    let file = fs_err::File::open(path).ok()?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut bytes).ok()?;
    (bytes.len() <= 200_000).then_some(bytes)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn tar_of(member: &str, bytes: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, member, bytes).unwrap();
    builder.into_inner().unwrap()
}

/// Loads `path` as `replay` does (`traces::load`) and, for a JSON file, as `calibrate`'s
/// Kineto import does; an error must name the file (or `ARCHIVE:MEMBER`).
fn load_cleanly(path: &Path) -> Result<(), TestCaseError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let paths = [path.to_path_buf()];
    if let Err(error) = traces::load(&paths) {
        // A member of an archive is named `ARCHIVE:MEMBER`.
        names_one_of(&error.to_string(), &[&name])?;
    }
    if name.ends_with(".json") {
        let _ = traces::kineto::import(&paths);
    }
    Ok(())
}

/// The JSON trace formats: Kineto (a synthetic rank, Holistic Trace Analysis' small traces),
/// PyTorch execution traces and Chakra JSON (from the shared data, small files only), and the
/// hostile catalog's Kineto and execution-trace texts, each mutated and then written plain,
/// gzipped, in a tar or in a tar.gz: a trace, or an error naming the file.
#[test]
fn trace_json_files() {
    let mut seeds: Vec<String> = vec![String::from_utf8(kineto_seed()).unwrap()];
    for shared in [
        "HolisticTraceAnalysis/execution_trace/benchmark_simple_add_et.json.gz",
        "HolisticTraceAnalysis/execution_trace/benchmark_simple_add_trace.json.gz",
        "HolisticTraceAnalysis/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
    ] {
        seeds.extend(shared_gz(shared).and_then(|b| String::from_utf8(b).ok()));
    }
    for bytes in shared_members("chakra/tests/data/json_trace.tar.gz", ".json")
        .into_iter()
        .chain(shared_members("chakra/tests/data/1.0.2-chakra.0.0.4.tgz", ".json"))
    {
        seeds.extend(String::from_utf8(bytes).ok());
    }
    seeds.extend(fuzzing::hostile_texts("kineto"));
    seeds.extend(fuzzing::hostile_texts("execution-trace"));
    let dir = scratch("fuzz-trace-json");
    let strategy = (fuzzing::mutated_text(seeds), 0u8..4);
    let cases =
        Campaign::from_env("trace_json_files").with_default_cases(16).run(strategy, |(text, wrapper)| {
            let (name, bytes) = match wrapper {
                0 => ("rank0.json", text.into_bytes()),
                1 => ("rank0.json.gz", gzip(text.as_bytes())),
                2 => ("ranks.tar", tar_of("rank0.json", text.as_bytes())),
                _ => ("ranks.tgz", gzip(&tar_of("rank0.json", text.as_bytes()))),
            };
            let path = dir.join(name);
            fs_err::write(&path, bytes).unwrap();
            load_cleanly(&path)
        });
    assert!(cases >= 16);
}

/// The binary trace formats: `.pstrace`, Chakra protobuf `.et` and the wrappers themselves
/// (a gzipped Kineto file, a tar and a tar.gz of one, Chakra's own `.tgz`), their bytes
/// mutated: a trace, or an error naming the file.
#[test]
fn trace_binary_files() {
    let dir = scratch("fuzz-trace-binary");
    crate::chakra::write_protobuf_job(&dir);
    let et = fs_err::read(dir.join("job.0.et")).unwrap();
    let kineto = kineto_seed();
    let mut seeds: Vec<(&str, Vec<u8>)> = vec![
        ("rank0.pstrace", pstrace_seed("fuzz-trace-binary-seed")),
        ("job.0.et", et),
        ("rank0.json.gz", gzip(&kineto)),
        ("ranks.tar", tar_of("rank0.json", &kineto)),
        ("ranks.tar.gz", gzip(&tar_of("rank0.json", &kineto))),
    ];
    let chakra = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/traces/chakra/tests/data/1.0.2-chakra.0.0.4.tgz");
    if let Ok(bytes) = fs_err::read(&chakra) {
        seeds.push(("chakra.tgz", bytes));
    }
    let names: Vec<&str> = seeds.iter().map(|(name, _)| *name).collect();
    let strategy = fuzzing::byte_mutants(seeds.into_iter().map(|(_, bytes)| bytes).collect());
    let cases =
        Campaign::from_env("trace_binary_files").with_default_cases(32).run(strategy, |(seed, bytes)| {
            let path: PathBuf = dir.join(names[seed]);
            fs_err::write(&path, bytes).unwrap();
            load_cleanly(&path)
        });
    assert!(cases >= 16);
}

/// Regression (trace_binary_files, its first finding): a broken trace inside an archive was
/// reported under the temporary path it was unpacked to (`/tmp/parasim-trace-.../00001-...`),
/// which means nothing to the user and is gone when the command ends; it is named
/// `ARCHIVE:MEMBER`, for execution traces and Kineto traces alike.
#[test]
fn a_broken_member_of_an_archive_is_named_by_the_archive() {
    let dir = scratch("fuzz-archive-member");
    let et = shared_gz("HolisticTraceAnalysis/execution_trace/benchmark_simple_add_et.json.gz")
        .expect("the shared HTA execution trace");
    let kineto = kineto_seed();
    for (member, bytes) in [("et.0.json", &et[..et.len() / 2]), ("rank0.json", &kineto[..kineto.len() / 2])] {
        let archive = dir.join("job.tgz");
        fs_err::write(&archive, gzip(&tar_of(member, bytes))).unwrap();
        let error = traces::load(std::slice::from_ref(&archive)).unwrap_err().to_string();
        assert!(error.contains(&format!("job.tgz:{member}")), "{error}");
        // Not the folder it was unpacked to (`parasim-trace-XXXXXX`).
        assert!(!error.contains("parasim-trace-"), "{error}");
    }
}

/// Found by `trace_json_files` (CI's seed 0): a rank file inside a `.tar` whose rank lies
/// outside its world was reported by the temporary path it was unpacked to; every file the
/// message names is now `ARCHIVE:MEMBER`.
#[test]
fn a_member_outside_its_world_is_named_by_the_archive() {
    let dir = scratch("fuzz-archive-world");
    let kineto = String::from_utf8(kineto_seed()).expect("the seed is text");
    assert!(kineto.contains("\"rank\": 0,"), "the seed names its rank");
    let outside = kineto.replacen("\"rank\": 0,", "\"rank\": 109,", 1);
    let archive = dir.join("ranks.tar");
    fs_err::write(&archive, tar_of("rank0.json", outside.as_bytes())).unwrap();
    let error = traces::load(std::slice::from_ref(&archive)).unwrap_err().to_string();
    assert!(error.contains("ranks.tar:rank0.json is rank 109"), "{error}");
    assert!(!error.contains("parasim-trace-"), "{error}");
}
