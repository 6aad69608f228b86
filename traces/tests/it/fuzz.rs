//! Mutation fuzzing of the trace readers with proptest: valid inputs (a synthetic Kineto
//! trace, its `.pstrace`, an nccl-tests log) with random bytes replaced, deleted, inserted or
//! duplicated must give a result or an error, never a panic. `PROPTEST_CASES=N` runs longer
//! campaigns (docs/fuzzing.md).

use std::path::Path;

use proptest::prelude::*;
use traces::synthetic::SyntheticJob;

use crate::common::scratch;

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Replace(prop::sample::Index, u8),
    Delete(prop::sample::Index, usize),
    Insert(prop::sample::Index, Vec<u8>),
    Duplicate(prop::sample::Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<prop::sample::Index>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<prop::sample::Index>(), 1usize..256).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ]
}

/// `seed` with `edits` applied, in order.
fn mutate(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for edit in edits {
        if bytes.is_empty() {
            break;
        }
        match edit {
            Edit::Replace(i, b) => {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            Edit::Delete(i, n) => {
                let at = i.index(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            Edit::Insert(i, new) => {
                let at = i.index(bytes.len());
                bytes.splice(at..at, new.iter().copied());
            }
            Edit::Duplicate(i, n) => {
                let at = i.index(bytes.len());
                let end = (at + n).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(end..end, copy);
            }
        }
    }
    bytes
}

fn small_job() -> SyntheticJob {
    SyntheticJob { world_size: 1, steps: 2, layers: 6, layers_per_bucket: 3, ..SyntheticJob::default() }
}

fn kineto_seed() -> Vec<u8> {
    let mut bytes = Vec::new();
    small_job().write_rank(0, &mut bytes).unwrap();
    bytes
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
    fn kineto_import_never_panics(edits in prop::collection::vec(edit(), 1..8)) {
        let dir = scratch("fuzz-kineto");
        let path = dir.join("rank0.json");
        fs_err::write(&path, mutate(&kineto_seed(), &edits)).unwrap();
        let _ = traces::kineto::import(std::slice::from_ref(&path));
        let _ = traces::load(std::slice::from_ref(&path));
    }

    #[test]
    fn pstrace_decoding_never_panics(edits in prop::collection::vec(edit(), 1..8)) {
        let dir = scratch("fuzz-pstrace");
        let json = dir.join("rank0.json");
        fs_err::write(&json, kineto_seed()).unwrap();
        let trace = traces::load(std::slice::from_ref(&json)).unwrap().trace;
        let bytes = traces::binary::to_bytes(&trace).unwrap();
        let mutated = mutate(&bytes, &edits);
        if let Err(error) = traces::binary::from_bytes(&mutated, Path::new("fuzz.pstrace")) {
            prop_assert!(error.to_string().contains("fuzz.pstrace"), "{}", error);
        }
    }

    #[test]
    fn nccl_tests_parsing_never_panics(edits in prop::collection::vec(edit(), 1..8)) {
        let mutated = mutate(NCCL_LOG.as_bytes(), &edits);
        let text = String::from_utf8_lossy(&mutated);
        let _ = traces::nccl::parse_tests_output(&text, Path::new("fuzz.log"));
    }
}
