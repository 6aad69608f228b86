//! What NCCL kernel names, PyTorch's collective names and dtype names mean.

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
