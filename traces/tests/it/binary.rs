//! The .pstrace format and the Kineto writer: round trips, and bad files.

use traces::binary::{self, from_bytes, to_bytes};
use traces::kineto::{import, write_trace_files};
use traces::{Trace, TraceError};

use crate::common::{dlrm_directory, scratch, shared};

fn without_sources(mut trace: Trace) -> Trace {
    for rank in &mut trace.ranks {
        rank.source.clear();
    }
    trace
}

#[test]
fn binary_round_trip_is_exact() {
    for path in [
        shared("HolisticTraceAnalysis/nccl_parser_config/nccl_data.json.gz"),
        shared("HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"),
    ] {
        let trace = import(std::slice::from_ref(&path)).unwrap().trace;
        let bytes = to_bytes(&trace).unwrap();
        assert_eq!(&bytes[..8], b"PSTRACE\0");
        let back = from_bytes(&bytes, &path).unwrap();
        assert_eq!(back, trace, "{}", path.display());
    }
}

#[test]
fn kineto_writer_round_trip_is_exact() {
    let original = import(&[dlrm_directory()]).unwrap().trace;
    let out = scratch("kineto-round-trip");
    let written = write_trace_files(&original, &out).unwrap();
    assert_eq!(written.len(), 8);
    let again = import(&[out]).unwrap().trace;
    assert_eq!(without_sources(again), without_sources(original));

    let single =
        import(&[shared("HolisticTraceAnalysis/nccl_parser_config/nccl_data.json.gz")]).unwrap().trace;
    let file = scratch("kineto-single").join("rank0.json");
    write_trace_files(&single, &file).unwrap();
    assert_eq!(without_sources(import(&[file]).unwrap().trace), without_sources(single));
}

#[test]
fn bad_and_truncated_files_are_errors_not_panics() {
    let trace = import(&[shared("HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz")]).unwrap().trace;
    let bytes = to_bytes(&trace).unwrap();
    let path = std::path::Path::new("test.pstrace");
    // Cut at every header field and at many points in the payload.
    let mut cuts: Vec<usize> = vec![0, 1, 7, 8, 11, 12, 20, 31, 32, 33];
    cuts.extend((1..200).map(|i| bytes.len() * i / 200));
    cuts.push(bytes.len() - 1);
    for cut in cuts {
        let error = from_bytes(&bytes[..cut], path).unwrap_err();
        assert!(matches!(error, TraceError::Binary { .. }), "cut at {cut}: {error}");
    }
    // Flipped bytes anywhere in the payload are caught (checksum, then decoding and validation).
    for at in (32..bytes.len()).step_by(bytes.len() / 97) {
        let mut corrupt = bytes.clone();
        corrupt[at] ^= 0x5a;
        assert!(from_bytes(&corrupt, path).is_err(), "flip at {at}");
    }
    // Another version.
    let mut newer = bytes.clone();
    newer[8] = 2;
    let message = from_bytes(&newer, path).unwrap_err().to_string();
    assert!(message.contains("version 2"), "{message}");
    // Not a .pstrace at all.
    let message = from_bytes(b"{\"traceEvents\": []}", path).unwrap_err().to_string();
    assert!(message.contains("magic"), "{message}");
    // A payload that passes the checksum but is not a trace (a hand-made header).
    let mut forged = bytes[..32].to_vec();
    let payload = vec![0xffu8; 40];
    forged[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in &payload {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    forged[24..32].copy_from_slice(&hash.to_le_bytes());
    forged.extend_from_slice(&payload);
    assert!(matches!(
        from_bytes(&forged, path),
        Err(TraceError::Binary { .. } | TraceError::Meaningless { .. })
    ));
}

#[test]
fn load_recognizes_a_binary_file_by_its_magic_number() {
    let trace = import(&[shared("HolisticTraceAnalysis/trace_filter/sampled_rank-1.json.gz")]).unwrap().trace;
    let path = scratch("load-binary").join("renamed.json");
    binary::write(&trace, &path).unwrap();
    let loaded = traces::load(&[path]).unwrap();
    assert!(loaded.binary);
    assert_eq!(loaded.trace, trace);
}
