//! What NCCL kernel names, PyTorch's collective names and dtype names mean, and the output
//! of nccl-tests (`all_reduce_perf` and friends).

use std::collections::BTreeMap;
use std::path::Path;

use crate::TraceError;
use crate::model::CollectiveType;

/// True if `name` is an NCCL kernel (`ncclKernel_...`, `ncclDevKernel_...`).
pub fn is_nccl_kernel(name: &str) -> bool {
    let name = name.strip_prefix("void ").unwrap_or(name);
    name.starts_with("nccl")
}

/// The operation and algorithm an NCCL kernel name spells, e.g.
/// `ncclKernel_AllReduce_RING_LL_Sum_float(...)` -> (AllReduce, "RING") and
/// `ncclDevKernel_AllGather_RING_LL(...)` -> (AllGather, "RING"). `SendRecv` kernels carry
/// all-to-all and point-to-point traffic alike, so they map to [`CollectiveType::Unknown`]
/// here and the caller decides from the host-side annotation. NCCL 2.19+ `Generic` kernels say
/// nothing either.
pub fn parse_kernel_name(name: &str) -> (CollectiveType, Option<String>) {
    let name = name.strip_prefix("void ").unwrap_or(name);
    let base = name.split('(').next().unwrap_or(name);
    let mut kind = CollectiveType::Unknown;
    let mut algorithm = None;
    for token in base.split('_') {
        match token {
            "AllReduce" => kind = CollectiveType::AllReduce,
            "AllGather" => kind = CollectiveType::AllGather,
            "ReduceScatter" => kind = CollectiveType::ReduceScatter,
            "Broadcast" => kind = CollectiveType::Broadcast,
            "Reduce" => kind = CollectiveType::Reduce,
            "AllToAll" | "Alltoall" => kind = CollectiveType::AllToAll,
            "Send" => kind = CollectiveType::Send,
            "Recv" => kind = CollectiveType::Recv,
            "RING" | "TREE" | "COLLNET" | "COLLNETDIRECT" | "COLLNETCHAIN" | "NVLS" | "NVLSTREE" | "PAT" => {
                algorithm = Some(token.to_string());
            }
            _ => {}
        }
    }
    (kind, algorithm)
}

/// The operation a PyTorch collective name means: the `Collective name` argument
/// (`allreduce`, `_allgather_base`, `all_to_all`, `reduce_scatter_tensor_coalesced`, ...) or
/// a `nccl:` annotation (`nccl:all_reduce`, `nccl:_reduce_scatter_base`, ...).
pub fn parse_collective_name(name: &str) -> Option<CollectiveType> {
    let name = name.strip_prefix("nccl:").unwrap_or(name);
    let normalized: String =
        name.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect();
    let starts = |prefix: &str| normalized.starts_with(prefix);
    Some(if starts("allreduce") {
        CollectiveType::AllReduce
    } else if starts("allgather") {
        CollectiveType::AllGather
    } else if starts("reducescatter") {
        CollectiveType::ReduceScatter
    } else if starts("alltoall") {
        CollectiveType::AllToAll
    } else if starts("broadcast") || starts("bcast") {
        CollectiveType::Broadcast
    } else if starts("reduce") {
        CollectiveType::Reduce
    } else if starts("barrier") {
        CollectiveType::Barrier
    } else if starts("send") {
        CollectiveType::Send
    } else if starts("recv") {
        CollectiveType::Recv
    } else {
        return None;
    })
}

/// One measured size of an nccl-tests run (the out-of-place columns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TestsRow {
    /// Time per iteration in microseconds.
    pub time_us: f64,
    /// Bus bandwidth in GB/s as nccl-tests printed it.
    pub busbw: f64,
}

/// What an nccl-tests output file says: the run's shape (when its header is there) and the
/// out-of-place time of every size.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TestsOutput {
    /// Ranks of the run: the `#  Rank N ...` lines of the header (`None` without a header).
    pub ranks: Option<u32>,
    /// GPUs driven by each process (`nGpus` of the `# nThread 1 nGpus 8 ...` line, `-g`).
    pub gpus_per_process: Option<u32>,
    /// Rows by size in bytes.
    pub rows: BTreeMap<u64, TestsRow>,
}

/// Strips the prefix `mpirun --tag-output` puts on every line (`[1,0]<stdout>:`).
fn strip_mpi_prefix(line: &str) -> &str {
    if let Some(rest) = line.strip_prefix('[')
        && let Some((tag, after)) = rest.split_once(']')
        && tag.split(',').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        && let Some(after) = after.strip_prefix('<')
        && let Some((_, text)) = after.split_once(">:")
    {
        return text;
    }
    line
}

/// Reads nccl-tests output. Both column layouts are understood: the current one
/// (`size count type redop root time algbw busbw #wrong ...`) and the older one without the
/// `root` column (`size count type redop time algbw busbw error ...`). The column header line
/// says which; without it, the number of columns does (9 or 13 with `root`, 8 or 12 without:
/// out-of-place only, or out-of-place and in-place). Lines prefixed by MPI's `--tag-output`
/// (`[1,0]<stdout>:`) are read like the others.
pub fn parse_tests_output(text: &str, path: &Path) -> Result<TestsOutput, TraceError> {
    let mut output = TestsOutput::default();
    let mut ranks = 0u32;
    // Index of the time column, from the header when there is one.
    let mut time_column: Option<usize> = None;
    for (number, raw) in text.lines().enumerate() {
        let line = strip_mpi_prefix(raw).trim();
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if let Some(at) = words.iter().position(|w| *w == "nGpus") {
                output.gpus_per_process = words.get(at + 1).and_then(|w| w.parse().ok());
            }
            if words.first() == Some(&"Rank") && words.get(1).is_some_and(|w| w.parse::<u32>().is_ok()) {
                ranks += 1;
            }
            if words.first() == Some(&"size") && words.contains(&"time") {
                time_column = words.iter().position(|w| *w == "time");
            }
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(Ok(size)), Some(Ok(_count))) =
            (fields.first().map(|f| f.parse::<u64>()), fields.get(1).map(|f| f.parse::<u64>()))
        else {
            continue;
        };
        let column = match time_column {
            Some(column) => column,
            None => match fields.len() {
                9 | 13 => 5,
                8 | 12 => 4,
                other => {
                    return Err(TraceError::Meaningless {
                        path: path.to_path_buf(),
                        reason: format!(
                            "line {}: {other} columns and no column header; nccl-tests lines have 8 or 12 \
                             (size count type redop time algbw busbw error ...) or 9 or 13 (with root)",
                            number + 1
                        ),
                    });
                }
            },
        };
        let number_at = |index: usize, what: &str| -> Result<f64, TraceError> {
            let field = fields.get(index).copied().unwrap_or("");
            field.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(|| {
                TraceError::Meaningless {
                    path: path.to_path_buf(),
                    reason: format!("line {}: the {what} column is {field:?}, not a number", number + 1),
                }
            })
        };
        let time_us = number_at(column, "time (us)")?;
        let busbw = number_at(column + 2, "busbw (GB/s)")?;
        output.rows.insert(size, TestsRow { time_us, busbw });
    }
    if output.rows.is_empty() {
        return Err(TraceError::Meaningless {
            path: path.to_path_buf(),
            reason: "no nccl-tests result lines (size count type redop [root] time algbw busbw ...)".into(),
        });
    }
    output.ranks = (ranks > 0).then_some(ranks);
    Ok(output)
}

/// Bytes per element of a dtype as PyTorch profiles spell it (`float`, `Float`, `c10::Half`,
/// `long int`, `unsigned char`, `BFloat16`, ...); `None` if unknown.
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    let lower = dtype.trim().to_ascii_lowercase();
    let lower = lower.strip_prefix("c10::").unwrap_or(&lower);
    let lower = lower.strip_prefix("torch.").unwrap_or(lower);
    Some(match lower {
        "float" | "float32" | "int" | "int32" | "unsigned int" | "uint32" | "complexhalf" => 4,
        "double" | "float64" | "long" | "long int" | "int64" | "long long" | "unsigned long" | "uint64"
        | "complexfloat" => 8,
        "half" | "float16" | "bfloat16" | "short" | "int16" | "uint16" => 2,
        "unsigned char" | "uint8" | "byte" | "char" | "signed char" | "int8" | "bool" => 1,
        "complexdouble" => 16,
        other if other.starts_with("float8") => 1,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names() {
        assert_eq!(
            parse_kernel_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"),
            (CollectiveType::AllReduce, Some("RING".into()))
        );
        assert_eq!(
            parse_kernel_name(
                "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
            )
            .0,
            CollectiveType::Broadcast
        );
        assert_eq!(
            parse_kernel_name("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)").0,
            CollectiveType::ReduceScatter
        );
        assert_eq!(
            parse_kernel_name("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)").0,
            CollectiveType::Unknown
        );
        assert!(is_nccl_kernel("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"));
        assert!(!is_nccl_kernel("volta_sgemm_128x64_nn"));
    }

    #[test]
    fn collective_names() {
        assert_eq!(parse_collective_name("nccl:all_reduce"), Some(CollectiveType::AllReduce));
        assert_eq!(parse_collective_name("nccl:_all_gather_base"), Some(CollectiveType::AllGather));
        assert_eq!(parse_collective_name("_reduce_scatter_base"), Some(CollectiveType::ReduceScatter));
        assert_eq!(parse_collective_name("all_to_all"), Some(CollectiveType::AllToAll));
        assert_eq!(parse_collective_name("allreduce"), Some(CollectiveType::AllReduce));
        assert_eq!(parse_collective_name("reduce"), Some(CollectiveType::Reduce));
        assert_eq!(parse_collective_name("mystery"), None);
    }

    const WITH_ROOT: &str = "\
# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid   1234 on     host-0 device  0 [0x0f] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1235 on     host-1 device  0 [0x0f] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    135.8    0.00    0.00      0    130.1    0.00    0.00      0
     1048576        262144     float     sum      -1    203.2    5.16    9.68      0    201.0    5.22    9.78      0
";

    const WITHOUT_ROOT_MPI: &str = "\
[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 1024 maxBytes 4294967296 step: 2(factor) warmup iters: 20 iters: 50 validation: 0
[1,0]<stdout>:#   Rank  0 Pid  24127 on node-000000 device  0 [0x00] A100-SXM4-40GB
[1,0]<stdout>:#   Rank  1 Pid  24128 on node-000000 device  1 [0x00] A100-SXM4-40GB
[1,0]<stdout>:#   Rank  2 Pid  10605 on node-000002 device  0 [0x00] A100-SXM4-40GB
[1,0]<stdout>:#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
[1,0]<stdout>:        1024           256     float     sum    34.66    0.03    0.06  0e+00    34.47    0.03    0.06  0e+00
[1,0]<stdout>: 17179869184    4294967296     float     sum   251757   68.24  127.95    N/A   250681   68.53  128.50    N/A
[1,0]<stdout>:# Avg bus bandwidth    : 60.5716
";

    #[test]
    fn tests_output_with_the_root_column() {
        let output = parse_tests_output(WITH_ROOT, Path::new("h100.txt")).unwrap();
        assert_eq!(output.ranks, Some(2));
        assert_eq!(output.gpus_per_process, Some(1));
        assert_eq!(output.rows.len(), 2);
        assert_eq!(output.rows[&8], TestsRow { time_us: 135.8, busbw: 0.0 });
        assert_eq!(output.rows[&1048576], TestsRow { time_us: 203.2, busbw: 9.68 });
    }

    #[test]
    fn tests_output_without_the_root_column_under_mpi() {
        let output = parse_tests_output(WITHOUT_ROOT_MPI, Path::new("azure.log")).unwrap();
        assert_eq!(output.ranks, Some(3));
        assert_eq!(output.gpus_per_process, Some(1));
        assert_eq!(output.rows[&1024], TestsRow { time_us: 34.66, busbw: 0.06 });
        assert_eq!(output.rows[&17179869184], TestsRow { time_us: 251757.0, busbw: 127.95 });
    }

    #[test]
    fn tests_output_without_a_header_is_read_by_its_column_count() {
        let old = "        1024           256     float     sum    34.66    0.03    0.06  0e+00\n";
        let new = "        1024           256     float     sum      -1    34.66    0.03    0.06      0\n";
        for text in [old, new] {
            let output = parse_tests_output(text, Path::new("x")).unwrap();
            assert_eq!(output.rows[&1024].time_us, 34.66, "{text}");
            assert_eq!(output.ranks, None);
        }
        let error = parse_tests_output("1024 256 float sum 1 2 3\n", Path::new("x")).unwrap_err();
        assert!(error.to_string().contains("7 columns"), "{error}");
        let error = parse_tests_output("# nothing\n", Path::new("x")).unwrap_err();
        assert!(error.to_string().contains("no nccl-tests result lines"), "{error}");
        assert_eq!(strip_mpi_prefix("[12,3]<stderr>:# x"), "# x");
        assert_eq!(strip_mpi_prefix("[a]<stdout>:x"), "[a]<stdout>:x");
    }

    #[test]
    fn dtypes() {
        assert_eq!(dtype_bytes("float"), Some(4));
        assert_eq!(dtype_bytes("Float"), Some(4));
        assert_eq!(dtype_bytes("c10::Half"), Some(2));
        assert_eq!(dtype_bytes("long int"), Some(8));
        assert_eq!(dtype_bytes("unsigned char"), Some(1));
        assert_eq!(dtype_bytes("BFloat16"), Some(2));
        assert_eq!(dtype_bytes("Scalar"), None);
    }
}
