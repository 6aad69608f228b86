//! The device catalog: peak compute rates, memory and interconnect bandwidths of accelerators,
//! each taken from the vendor datasheet it names.
//!
//! The built-in catalog is `data/devices.toml`, compiled into the library; user catalogs in the
//! same format load with [`DeviceCatalog::from_toml_str`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use sim_core::nccl::protocol::ProtocolChoice;
use sim_core::units::{Bandwidth, Bytes, FlopRate};

/// The built-in catalog's text, checked by a unit test.
const BUILTIN_TOML: &str = include_str!("../../data/devices.toml");

/// A numeric format that tensors are stored and multiplied in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE double precision.
    Fp64,
    /// IEEE single precision.
    Fp32,
    /// NVIDIA TensorFloat-32: FP32 storage, 10-bit mantissa inside Tensor Core multiplies.
    Tf32,
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 8-bit floating point (E4M3/E5M2).
    Fp8,
}

impl Dtype {
    /// Every dtype, in declaration order.
    pub const ALL: [Dtype; 6] = [Dtype::Fp64, Dtype::Fp32, Dtype::Tf32, Dtype::Fp16, Dtype::Bf16, Dtype::Fp8];

    /// The lowercase name used in files and on the command line (`"bf16"`).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Fp64 => "fp64",
            Dtype::Fp32 => "fp32",
            Dtype::Tf32 => "tf32",
            Dtype::Fp16 => "fp16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
        }
    }

    /// Bytes one element occupies in memory (TF32 is stored as FP32: 4).
    pub const fn bytes(self) -> u64 {
        match self {
            Dtype::Fp64 => 8,
            Dtype::Fp32 | Dtype::Tf32 => 4,
            Dtype::Fp16 | Dtype::Bf16 => 2,
            Dtype::Fp8 => 1,
        }
    }

    /// The dtype tensors are stored in when a model trains in `self`: bf16 for fp8, itself for
    /// every other dtype. FP8 training as Transformer Engine runs it (delayed scaling) keeps
    /// activations, weights, gradients and every kernel but its linear layers' matrix products
    /// in bf16, and casts only those products' inputs to fp8 (docs/compute-model.md, "FP8
    /// training"): activations sent between ranks and the element-wise kernels' traffic are
    /// bf16-wide.
    pub const fn storage(self) -> Dtype {
        match self {
            Dtype::Fp8 => Dtype::Bf16,
            other => other,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = DeviceError;
    /// Reads a dtype name, ignoring case (`"BF16"` is `bf16`).
    fn from_str(input: &str) -> Result<Self, DeviceError> {
        let text = input.trim();
        Dtype::ALL
            .into_iter()
            .find(|dtype| dtype.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| DeviceError::UnknownDtype { given: input.to_string() })
    }
}

/// What can go wrong looking up or loading devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// No device of that name in the catalog.
    #[error("unknown device {given:?}; known devices: {known}")]
    UnknownDevice {
        /// The name asked for.
        given: String,
        /// The catalog's names, comma-separated.
        known: String,
    },
    /// The device has no peak rate for this dtype (e.g. BF16 on a V100).
    #[error("device {device} has no {dtype} rate; it has: {available}")]
    UnsupportedDtype {
        /// The device's catalog name.
        device: String,
        /// The dtype asked for.
        dtype: Dtype,
        /// The dtypes the device does have, comma-separated.
        available: String,
    },
    /// The text is not a dtype name.
    #[error("unknown dtype {given:?}; valid dtypes: fp64, fp32, tf32, fp16, bf16, fp8")]
    UnknownDtype {
        /// The text as given.
        given: String,
    },
    /// The catalog is not valid TOML, or a key is missing, unknown, or has a bad value.
    #[error("cannot read the device catalog: {error}")]
    Parse {
        /// The TOML reader's message, with line and column.
        error: toml::de::Error,
    },
    /// Two devices share a name (names compare without case).
    #[error("device catalog lists {name:?} twice; names must be unique, ignoring case")]
    DuplicateDevice {
        /// The repeated name.
        name: String,
    },
    /// A device entry has a value that parses but makes no sense.
    #[error("device {device:?}: `{key}` {reason}")]
    InvalidEntry {
        /// The device's name as written.
        device: String,
        /// The offending key.
        key: &'static str,
        /// What is wrong and what would be valid.
        reason: &'static str,
    },
}

/// One accelerator model with its datasheet numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Device {
    /// Catalog key, lowercase (`"a100-sxm4-80gb"`).
    pub name: String,
    /// Name for reports (`"A100-SXM4-80GB"`).
    pub display_name: String,
    /// Dense peak compute rate per dtype (Tensor Core rates where the device has them; no
    /// sparsity).
    pub peak: BTreeMap<Dtype, FlopRate>,
    /// Peak device-memory bandwidth.
    pub memory_bandwidth: Bandwidth,
    /// Device-memory capacity as built (a little more than a program can allocate).
    pub memory_capacity: Bytes,
    /// Total NVLink bandwidth per GPU, both directions added, as datasheets quote it (one
    /// direction is half); `None` for devices without NVLink.
    pub nvlink_bandwidth: Option<Bandwidth>,
    /// Total AMD Infinity Fabric bandwidth between GPUs, both directions added, as AMD quotes
    /// it; `None` for devices without it. A device has NVLink or Infinity Fabric, not both.
    pub infinity_fabric_bandwidth: Option<Bandwidth>,
    /// Host link (PCIe) bandwidth per direction.
    pub pcie_bandwidth: Bandwidth,
    /// The datasheet the numbers come from: title and URL.
    pub source: String,
    /// How the device executes matrix products, for the shape-aware GEMM model; `None` where
    /// the catalog does not record it (CPU nodes), and GEMMs are priced by their FLOPs alone.
    pub execution: Option<Execution>,
    /// The library training jobs on this device run their collectives with.
    pub collectives: CollectiveLibrary,
    /// A GPU or a CPU: what reports call one device.
    pub kind: DeviceKind,
}

/// What a device is, for the words reports use (`kind` in the catalog; GPUs by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// An accelerator: reports count GPUs.
    #[default]
    Gpu,
    /// A CPU socket or a multi-socket node run as one device: reports count CPUs.
    Cpu,
}

impl DeviceKind {
    /// The word for one device in reports: "GPU" or "CPU".
    pub fn noun(self) -> &'static str {
        match self {
            DeviceKind::Gpu => "GPU",
            DeviceKind::Cpu => "CPU",
        }
    }
}

/// The collective library of a device's training jobs: it decides whether NCCL's protocols
/// and tuner apply (`simulation.protocol`'s default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveLibrary {
    /// NVIDIA's NCCL: LL/LL128/Simple protocols, chosen per collective by its tuner.
    #[default]
    Nccl,
    /// AMD's RCCL, NCCL's fork with its own tuning constants, which parasim does not have:
    /// collectives run on the links alone.
    Rccl,
    /// MPI on CPU nodes (its own algorithms, no NCCL protocols).
    Mpi,
}

impl CollectiveLibrary {
    /// The NCCL protocols of this library's collectives, `given` or by default: NCCL's tuner
    /// (`auto`) for NCCL, `off` for the others (parasim has no tuning of theirs); a protocol
    /// for a library without NCCL's protocols is an error that says what is valid.
    pub fn protocols(self, given: Option<ProtocolChoice>) -> Result<ProtocolChoice, String> {
        match (given, self) {
            (None, CollectiveLibrary::Nccl) => Ok(ProtocolChoice::Auto),
            (None, _) | (Some(ProtocolChoice::Off), _) => Ok(ProtocolChoice::Off),
            (Some(choice), CollectiveLibrary::Nccl) => Ok(choice),
            (Some(_), library) => Err(format!(
                "runs its collectives with {} (catalog `collectives`), which has no NCCL protocols: use \"off\"",
                library.name()
            )),
        }
    }

    /// The catalog's spelling.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveLibrary::Nccl => "nccl",
            CollectiveLibrary::Rccl => "rccl",
            CollectiveLibrary::Mpi => "mpi",
        }
    }
}

/// The execution resources of a GPU that decide how well a matrix product of a given shape
/// fills it, from the architecture whitepaper named in `execution-source`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Execution {
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD): the cores a kernel's thread
    /// blocks are spread over, one wave of tiles at a time.
    pub sm_count: u32,
    /// Boost clock, MHz: the clock the datasheet's peak rates are computed at.
    pub boost_clock_mhz: f64,
    /// Last-level on-chip cache (L2) in bytes.
    pub l2_cache: Bytes,
    /// Dtypes whose products run on matrix units (Tensor Cores, Matrix Cores). Products in other
    /// dtypes run on the vector units, where convolution libraries also use Winograd kernels.
    pub matrix_dtypes: Vec<Dtype>,
    /// The share of the datasheet's matrix-unit rates (computed at the boost clock) that the
    /// device sustains through long dense products, 1 when not measured. A 400 W A100 running
    /// Tensor Core GEMMs back to back sustains less than its rate at the 1410 MHz boost clock
    /// (power capping and the library's kernels, not told apart by the measurement); the value
    /// comes from a public sustained measurement of a large product, named in
    /// `matrix-sustained-source`. It scales every product on the matrix units (`ComputeModel`'s
    /// GEMM ceiling), on top of `gemm-efficiency`.
    #[serde(default = "one")]
    pub matrix_sustained_fraction: f64,
    /// Where `matrix-sustained-fraction` comes from (empty when it is 1).
    #[serde(default)]
    pub matrix_sustained_source: String,
    /// The share of the datasheet's fp8 rate that the device sustains through long dense fp8
    /// products, when it was measured apart: fp8 products run twice the 16-bit rate per clock
    /// but draw more power per clock, so a power-capped device sustains a smaller share of its
    /// fp8 rate than of its bf16 one. `None`: `matrix-sustained-fraction` applies to fp8 too.
    /// Named in `fp8-sustained-source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_sustained_fraction: Option<f64>,
    /// Where `fp8-sustained-fraction` comes from.
    #[serde(default)]
    pub fp8_sustained_source: String,
    /// The share of the aligned rate that a matrix-unit product off the 16-byte grid (a
    /// leading dimension not a multiple of 8 bf16 elements, GPT-2's 50,257-row vocabulary)
    /// reaches on this device, where it was measured: cuBLAS runs such products with
    /// one-element-aligned kernels (on Hopper, CUTLASS's sm75 `align1` kernels without wgmma).
    /// `None`: the compute model's `unaligned-gemm-efficiency` alone (1 unless a profile
    /// measures it). Named in `unaligned-matrix-source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unaligned_matrix_fraction: Option<f64>,
    /// Where `unaligned-matrix-fraction` comes from.
    #[serde(default)]
    pub unaligned_matrix_source: String,
    /// Output tile shapes (rows x columns of the product one thread block computes) that the
    /// device's GEMM libraries choose from; empty means [`DEFAULT_TILES`].
    #[serde(default)]
    pub tiles: Vec<[u32; 2]>,
    /// Output tile shapes (output positions x channels) of the device's convolution library's
    /// matrix-unit implicit-GEMM kernels, when they are fewer than its GEMM tiles; empty means
    /// [`Execution::tiles`]. cuDNN 7 on Volta has three (see the V100 entries of
    /// `data/devices.toml`).
    #[serde(default)]
    pub conv_tiles: Vec<[u32; 2]>,
    /// The whitepaper or datasheet these numbers come from.
    pub source: String,
}

/// The thread-block tiles of cuBLAS's and CUTLASS's Volta-to-Hopper GEMM kernels, largest
/// first (CUTLASS `default_gemm_configuration.h` and its profiler's kernel list: 256x128 and
/// 128x256 down to 64x64 for Tensor Core kernels, with 128x32, 32x128 and smaller SIMT tiles
/// for thin products).
pub const DEFAULT_TILES: [[u32; 2]; 13] = [
    [256, 128],
    [128, 256],
    [128, 128],
    [128, 64],
    [64, 128],
    [64, 64],
    [128, 32],
    [32, 128],
    [64, 32],
    [32, 64],
    [128, 16],
    [16, 128],
    [32, 32],
];

/// The thread-block tiles of cuDNN's implicit-GEMM convolution kernels on vector units (fp32
/// SIMT, and every dtype on devices without matrix units): 128 output positions (rows) by 128,
/// 64 or 32 channels (columns). cuDNN 7 names them by tile: forward
/// `volta_scudnn_128x{128,64,32}_relu_{small,medium,interior}_nn_v1` (2-D) and
/// `volta_scudnn_128x{64,32}_3dconv_fprop_small_nn_v1` (3-D), backward-data
/// `volta_scudnn_128x64_stridedB_{small,interior}_nn_v1`, backward-weight
/// `volta_scudnn_128x{128,64}_stridedB_splitK_{small,interior,medium}_nn_v1` (kernel names
/// recorded in public TensorFlow and PyTorch profiles of V100s, and in a Nsight Compute roofline
/// of CosmoFlow's layers on a GV100; Maxwell and Pascal run the same tiles as
/// `maxwell_scudnn_128x*`). There is no tile narrower than 32 channels: a convolution with 16
/// output channels (CosmoFlow's first layer) fills half of each 128x32 tile, which cuBLAS's and
/// CUTLASS's 128x16 GEMM tiles would not waste.
pub const CONV_VECTOR_TILES: [[u32; 2]; 3] = [[128, 128], [128, 64], [128, 32]];

/// Serde's default for [`Execution::matrix_sustained_fraction`]: the datasheet's rate.
const fn one() -> f64 {
    1.0
}

impl Execution {
    /// The tiles GEMMs choose from on this device.
    pub fn tiles(&self) -> &[[u32; 2]] {
        if self.tiles.is_empty() { &DEFAULT_TILES } else { &self.tiles }
    }

    /// The tiles matrix-unit convolutions choose from on this device.
    pub fn conv_tiles(&self) -> &[[u32; 2]] {
        if self.conv_tiles.is_empty() { self.tiles() } else { &self.conv_tiles }
    }

    /// The share of the datasheet's `dtype` matrix rate the device sustains through long dense
    /// products: `fp8-sustained-fraction` for fp8 where it was measured apart, else
    /// `matrix-sustained-fraction`.
    pub fn sustained_fraction(&self, dtype: Dtype) -> f64 {
        match (dtype, self.fp8_sustained_fraction) {
            (Dtype::Fp8, Some(fraction)) => fraction,
            _ => self.matrix_sustained_fraction,
        }
    }

    /// The share of the aligned rate an unaligned matrix-unit product reaches:
    /// `unaligned-matrix-fraction` where measured, else 1.
    pub fn unaligned_fraction(&self, dtype: Dtype) -> f64 {
        match self.unaligned_matrix_fraction {
            Some(fraction) if self.on_matrix_units(dtype) => fraction,
            _ => 1.0,
        }
    }

    /// Whether `dtype` products run on the matrix units.
    pub fn on_matrix_units(&self, dtype: Dtype) -> bool {
        self.matrix_dtypes.contains(&dtype)
    }
}

impl Device {
    /// The total bandwidth of the device's GPU-to-GPU links, both directions added: NVLink or
    /// Infinity Fabric, whichever it has; `None` if it has neither (PCIe cards, CPU nodes).
    pub fn gpu_link_bandwidth(&self) -> Option<Bandwidth> {
        self.nvlink_bandwidth.or(self.infinity_fabric_bandwidth)
    }

    /// Whether `other` computes exactly like this device: the same peak rate for every dtype
    /// and the same memory bandwidth (V100-SXM2 16 GB and 32 GB; not A100 40 GB and 80 GB,
    /// whose bandwidths differ). A compute profile of one serves the other.
    pub fn same_compute(&self, other: &Device) -> bool {
        self.peak == other.peak
            && self.memory_bandwidth == other.memory_bandwidth
            && self.execution == other.execution
    }

    /// The highest dense peak rate over the device's dtypes.
    pub fn fastest_peak(&self) -> Option<FlopRate> {
        self.peak.values().copied().max_by(|a, b| a.per_second().total_cmp(&b.per_second()))
    }

    /// The dense peak rate for `dtype`, or an error naming the dtypes this device has.
    pub fn peak(&self, dtype: Dtype) -> Result<FlopRate, DeviceError> {
        self.peak.get(&dtype).copied().ok_or_else(|| DeviceError::UnsupportedDtype {
            device: self.name.clone(),
            dtype,
            available: join(self.peak.keys().map(|dtype| dtype.name())),
        })
    }
}

/// A device as written in a catalog file, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct DeviceSpec {
    name: String,
    display_name: String,
    source: String,
    peak: BTreeMap<Dtype, FlopRate>,
    memory_bandwidth: Bandwidth,
    memory_capacity: Bytes,
    nvlink_bandwidth: Option<Bandwidth>,
    infinity_fabric_bandwidth: Option<Bandwidth>,
    pcie_bandwidth: Bandwidth,
    execution: Option<Execution>,
    #[serde(default)]
    collectives: CollectiveLibrary,
    #[serde(default)]
    kind: DeviceKind,
}

/// A catalog file: a list of `[[device]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    device: Vec<DeviceSpec>,
}

impl DeviceSpec {
    fn validate(self) -> Result<Device, DeviceError> {
        let invalid = |key, reason| DeviceError::InvalidEntry { device: self.name.clone(), key, reason };
        if self.name.is_empty() || self.name.chars().any(|c| c.is_whitespace() || c.is_uppercase()) {
            return Err(invalid(
                "name",
                "must be non-empty, lowercase, without spaces (e.g. \"a100-sxm4-80gb\")",
            ));
        }
        if self.display_name.trim().is_empty() {
            return Err(invalid("display-name", "must not be empty"));
        }
        if self.source.trim().is_empty() {
            return Err(invalid("source", "must name the datasheet the numbers come from"));
        }
        if self.peak.is_empty() {
            return Err(invalid("peak", "needs at least one rate, e.g. fp32 = \"19.5 TFLOP/s\""));
        }
        if self.memory_capacity == Bytes::ZERO {
            return Err(invalid("memory-capacity", "must be greater than zero"));
        }
        if let Some(execution) = &self.execution {
            if execution.sm_count == 0 {
                return Err(invalid("execution.sm-count", "must be at least 1"));
            }
            if !(execution.boost_clock_mhz.is_finite() && execution.boost_clock_mhz > 0.0) {
                return Err(invalid("execution.boost-clock-mhz", "must be a positive number of MHz"));
            }
            if execution.tiles.iter().any(|tile| tile[0] == 0 || tile[1] == 0) {
                return Err(invalid("execution.tiles", "must be positive [rows, columns] pairs"));
            }
            if execution.conv_tiles.iter().any(|tile| tile[0] == 0 || tile[1] == 0) {
                return Err(invalid("execution.conv-tiles", "must be positive [rows, columns] pairs"));
            }
            if execution.matrix_dtypes.iter().any(|dtype| !self.peak.contains_key(dtype)) {
                return Err(invalid("execution.matrix-dtypes", "lists a dtype without a `peak` rate"));
            }
            if execution.source.trim().is_empty() {
                return Err(invalid("execution.source", "must name the document the numbers come from"));
            }
            let fraction = execution.matrix_sustained_fraction;
            // Written so that NaN fails too.
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(invalid("execution.matrix-sustained-fraction", "must be in (0, 1]"));
            }
            if fraction != 1.0 && execution.matrix_sustained_source.trim().is_empty() {
                return Err(invalid(
                    "execution.matrix-sustained-source",
                    "must name the measurement `matrix-sustained-fraction` comes from",
                ));
            }
            if let Some(fp8) = execution.fp8_sustained_fraction {
                if !(fp8 > 0.0 && fp8 <= 1.0) {
                    return Err(invalid("execution.fp8-sustained-fraction", "must be in (0, 1]"));
                }
                if execution.fp8_sustained_source.trim().is_empty() {
                    return Err(invalid(
                        "execution.fp8-sustained-source",
                        "must name the measurement `fp8-sustained-fraction` comes from",
                    ));
                }
            }
            if let Some(unaligned) = execution.unaligned_matrix_fraction {
                if !(unaligned > 0.0 && unaligned <= 1.0) {
                    return Err(invalid("execution.unaligned-matrix-fraction", "must be in (0, 1]"));
                }
                if execution.unaligned_matrix_source.trim().is_empty() {
                    return Err(invalid(
                        "execution.unaligned-matrix-source",
                        "must name the measurement `unaligned-matrix-fraction` comes from",
                    ));
                }
            }
        }
        if self.nvlink_bandwidth.is_some() && self.infinity_fabric_bandwidth.is_some() {
            return Err(invalid(
                "infinity-fabric-bandwidth",
                "is given together with `nvlink-bandwidth`; a device has one kind of GPU-to-GPU link",
            ));
        }
        Ok(Device {
            name: self.name,
            display_name: self.display_name,
            peak: self.peak,
            memory_bandwidth: self.memory_bandwidth,
            memory_capacity: self.memory_capacity,
            nvlink_bandwidth: self.nvlink_bandwidth,
            infinity_fabric_bandwidth: self.infinity_fabric_bandwidth,
            pcie_bandwidth: self.pcie_bandwidth,
            source: self.source,
            execution: self.execution,
            collectives: self.collectives,
            kind: self.kind,
        })
    }
}

/// A set of devices looked up by name, in the order the catalog file lists them.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceCatalog {
    devices: Vec<Device>,
}

impl DeviceCatalog {
    /// The catalog built into parasim (`data/devices.toml`), parsed on first use.
    pub fn builtin() -> &'static DeviceCatalog {
        static BUILTIN: OnceLock<DeviceCatalog> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            DeviceCatalog::from_toml_str(BUILTIN_TOML)
                .expect("the built-in data/devices.toml is valid (checked by a unit test)")
        })
    }

    /// Whether what was measured on the catalog device `calibrated_on` (a compute profile)
    /// describes `device`: the same device, or one that computes exactly like it
    /// ([`Device::same_compute`]: the same peaks, memory bandwidth and execution).
    pub fn same_type(&self, calibrated_on: &str, device: &Device) -> bool {
        calibrated_on == device.name || self.get(calibrated_on).is_ok_and(|d| d.same_compute(device))
    }

    /// Reads a catalog in the `data/devices.toml` format and validates every entry.
    pub fn from_toml_str(text: &str) -> Result<DeviceCatalog, DeviceError> {
        let file: CatalogFile = toml::from_str(text).map_err(|error| DeviceError::Parse { error })?;
        let mut devices: Vec<Device> = Vec::with_capacity(file.device.len());
        for spec in file.device {
            if devices.iter().any(|known| known.name.eq_ignore_ascii_case(&spec.name)) {
                return Err(DeviceError::DuplicateDevice { name: spec.name });
            }
            devices.push(spec.validate()?);
        }
        Ok(DeviceCatalog { devices })
    }

    /// The device called `name` (case does not matter), or an error listing the known names.
    pub fn get(&self, name: &str) -> Result<&Device, DeviceError> {
        let wanted = name.trim();
        self.devices
            .iter()
            .find(|device| device.name.eq_ignore_ascii_case(wanted))
            .ok_or_else(|| DeviceError::UnknownDevice { given: name.to_string(), known: join(self.names()) })
    }

    /// The catalog names, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|device| device.name.as_str())
    }

    /// Every device, in file order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

/// `"a, b, c"`.
fn join<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tflops(rate: FlopRate) -> f64 {
        rate.per_second() / 1e12
    }

    #[test]
    fn builtin_catalog_parses_and_lists_the_datasheet_devices() {
        let catalog = DeviceCatalog::from_toml_str(BUILTIN_TOML).expect("data/devices.toml must parse");
        let names: Vec<&str> = catalog.names().collect();
        assert_eq!(
            names,
            [
                "v100-sxm2-16gb",
                "v100-sxm2-32gb",
                "p100-pcie-16gb",
                "a100-sxm4-40gb",
                "a100-sxm4-80gb",
                "h100-sxm5-80gb",
                "a100-pcie-40gb",
                "a100-pcie-80gb",
                "h100-pcie-80gb",
                "h200-sxm-141gb",
                "b200-sxm-180gb",
                "mi250x",
                "mi250x-gcd",
                "mi300x",
                "xeon-8160-2s",
                "xeon-8160-1s",
                "xeon-8280-2s",
                "xeon-8280-1s",
                "xeon-6148-2s",
                "epyc-7742-2s",
                "xeon-8480c-2s",
            ]
        );
        assert_eq!(&catalog, DeviceCatalog::builtin());
        // The GPU servers' host CPUs: memory bandwidth = sockets x channels x MT/s x 8 bytes.
        for (name, channels, transfers) in
            [("xeon-6148-2s", 12.0, 2666e6), ("epyc-7742-2s", 16.0, 3200e6), ("xeon-8480c-2s", 16.0, 4800e6)]
        {
            let cpu = catalog.get(name).unwrap();
            assert_eq!(cpu.kind, DeviceKind::Cpu, "{name}");
            let derived = channels * transfers * 8.0;
            let ratio = cpu.memory_bandwidth.bytes_per_second() / derived;
            assert!((ratio - 1.0).abs() < 0.001, "{name}: {ratio}");
        }
        // One socket is half its two-socket node: cores (peak), memory channels and DIMMs.
        for (node, socket) in [("xeon-8160-2s", "xeon-8160-1s"), ("xeon-8280-2s", "xeon-8280-1s")] {
            let (node, socket) = (catalog.get(node).unwrap(), catalog.get(socket).unwrap());
            for dtype in [Dtype::Fp32, Dtype::Fp64] {
                assert_eq!(node.peak[&dtype].per_second(), 2.0 * socket.peak[&dtype].per_second());
            }
            let ratio = node.memory_bandwidth.bytes_per_second() / socket.memory_bandwidth.bytes_per_second();
            assert!((ratio - 2.0).abs() < 0.001, "{}: {ratio}", socket.name);
            assert_eq!(node.memory_capacity.0, 2 * socket.memory_capacity.0);
        }
        // Names are unique (the loader refuses duplicates, ignoring case; checked again here).
        let mut lowercase: Vec<String> = names.iter().map(|name| name.to_lowercase()).collect();
        lowercase.sort();
        lowercase.dedup();
        assert_eq!(lowercase.len(), names.len());
        for device in catalog.devices() {
            assert!(device.source.contains("https://"), "{} names no URL", device.name);
            assert!(device.peak.contains_key(&Dtype::Fp32), "{} has no fp32 rate", device.name);
            assert!(device.peak.contains_key(&Dtype::Fp64), "{} has no fp64 rate", device.name);
            // Matrix units are never slower than fp32, and narrower dtypes never slower than wider.
            let rate = |dtype| device.peak.get(&dtype).map(|rate| rate.per_second());
            let order = [Dtype::Fp64, Dtype::Fp32, Dtype::Tf32, Dtype::Fp16, Dtype::Fp8];
            let rates: Vec<f64> = order.into_iter().filter_map(rate).collect();
            assert!(rates.windows(2).all(|pair| pair[0] <= pair[1]), "{}: {rates:?}", device.name);
            if let (Some(fp16), Some(bf16)) = (rate(Dtype::Fp16), rate(Dtype::Bf16)) {
                assert_eq!(fp16, bf16, "{}", device.name);
            }
            assert!(device.memory_capacity >= Bytes(16 << 30), "{}", device.name);
        }
    }

    #[test]
    fn execution_resources_agree_with_the_peak_rates() {
        // Peak = units x clock x FLOPs per unit per clock: the SM count and clock of each entry
        // must give its fp32 rate with a whole number of FLOPs per clock (128 on Pascal to
        // Ampere NVIDIA SMs, 256 on Hopper and on AMD's matrix fp32), within the datasheets'
        // rounding.
        let catalog = DeviceCatalog::builtin();
        let mut with_execution = 0;
        for device in catalog.devices() {
            let Some(execution) = &device.execution else { continue };
            with_execution += 1;
            let fp32 = device.peak(Dtype::Fp32).unwrap().per_second();
            let per_clock = fp32 / (f64::from(execution.sm_count) * execution.boost_clock_mhz * 1e6);
            let whole = if per_clock < 192.0 { 128.0 } else { 256.0 };
            assert!((per_clock / whole - 1.0).abs() < 0.01, "{}: {per_clock} FLOP/clock/SM", device.name);
            assert!(execution.source.contains("https://"), "{}", device.name);
            assert!(execution.l2_cache >= Bytes(4 << 20), "{}", device.name);
        }
        assert_eq!(with_execution, 13);
        let p100 = catalog.get("p100-pcie-16gb").unwrap();
        assert_eq!(tflops(p100.peak(Dtype::Fp32).unwrap()), 9.3);
        assert_eq!(p100.memory_bandwidth.bytes_per_second(), 732e9);
        let execution = p100.execution.as_ref().unwrap();
        assert_eq!((execution.sm_count, execution.matrix_dtypes.len()), (56, 0));
        let v100 = catalog.get("v100-sxm2-16gb").unwrap().execution.as_ref().unwrap();
        assert!(v100.on_matrix_units(Dtype::Fp16) && !v100.on_matrix_units(Dtype::Fp32));
        assert_eq!(v100.tiles(), &DEFAULT_TILES);
        assert_eq!(v100.conv_tiles(), &[[256, 128], [256, 64], [128, 128]]);
        let a100 = catalog.get("a100-sxm4-80gb").unwrap().execution.as_ref().unwrap();
        assert_eq!(a100.conv_tiles(), &DEFAULT_TILES);
    }

    #[test]
    fn every_gpu_has_one_kind_of_gpu_link_or_none() {
        let catalog = DeviceCatalog::builtin();
        for name in ["v100-sxm2-16gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb"]
        {
            let device = catalog.get(name).unwrap();
            assert!(
                device.nvlink_bandwidth.is_some() && device.infinity_fabric_bandwidth.is_none(),
                "{name}"
            );
        }
        for name in ["mi250x", "mi250x-gcd", "mi300x"] {
            let device = catalog.get(name).unwrap();
            assert!(
                device.nvlink_bandwidth.is_none() && device.infinity_fabric_bandwidth.is_some(),
                "{name}"
            );
        }
        for name in ["a100-pcie-40gb", "a100-pcie-80gb", "h100-pcie-80gb", "xeon-8160-2s", "xeon-8280-2s"] {
            assert_eq!(catalog.get(name).unwrap().gpu_link_bandwidth(), None, "{name}");
        }
        let mi300x = catalog.get("mi300x").unwrap();
        assert_eq!(mi300x.gpu_link_bandwidth().unwrap().bytes_per_second(), 896e9);
    }

    #[test]
    fn new_entries_have_their_datasheet_numbers() {
        let catalog = DeviceCatalog::builtin();
        let a100 = catalog.get("a100-pcie-80gb").unwrap();
        assert_eq!(a100.memory_bandwidth.bytes_per_second(), 1935e9);
        assert_eq!(tflops(a100.peak(Dtype::Fp16).unwrap()), 312.0);
        let h100 = catalog.get("h100-pcie-80gb").unwrap();
        assert_eq!(tflops(h100.peak(Dtype::Fp16).unwrap()), 756.5);
        assert_eq!(tflops(h100.peak(Dtype::Fp64).unwrap()), 51.0);
        let h200 = catalog.get("h200-sxm-141gb").unwrap();
        assert_eq!(h200.memory_capacity, Bytes(141 << 30));
        assert_eq!(h200.memory_bandwidth.bytes_per_second(), 4.8e12);
        let b200 = catalog.get("b200-sxm-180gb").unwrap();
        assert_eq!(tflops(b200.peak(Dtype::Bf16).unwrap()), 2250.0);
        assert_eq!(tflops(b200.peak(Dtype::Fp8).unwrap()), 4500.0);
        assert_eq!(b200.nvlink_bandwidth.unwrap().bytes_per_second(), 1.8e12);
        let mi250x = catalog.get("mi250x").unwrap();
        let gcd = catalog.get("mi250x-gcd").unwrap();
        assert_eq!(tflops(mi250x.peak(Dtype::Fp16).unwrap()), 383.0);
        assert_eq!(tflops(gcd.peak(Dtype::Fp16).unwrap()) * 2.0, 383.0);
        assert_eq!(gcd.memory_capacity.0 * 2, mi250x.memory_capacity.0);
        assert!(mi250x.peak(Dtype::Tf32).is_err());
        let mi300x = catalog.get("mi300x").unwrap();
        assert_eq!(tflops(mi300x.peak(Dtype::Bf16).unwrap()), 1307.4);
        assert_eq!(mi300x.memory_capacity, Bytes(192 << 30));
        // CPU nodes: cores x AVX-512 all-core clock x 32 FP64 FLOPs per cycle.
        let skx = catalog.get("xeon-8160-2s").unwrap();
        assert!((tflops(skx.peak(Dtype::Fp64).unwrap()) - 48.0 * 2.0e9 * 32.0 / 1e12).abs() < 1e-9);
        assert!(skx.peak(Dtype::Fp16).is_err());
        let clx = catalog.get("xeon-8280-2s").unwrap();
        assert!((tflops(clx.peak(Dtype::Fp32).unwrap()) - 56.0 * 2.4e9 * 64.0 / 1e12).abs() < 1e-9);
        assert_eq!(clx.memory_capacity, Bytes(192 << 30));
        assert_eq!(clx.fastest_peak().map(tflops), Some(tflops(clx.peak(Dtype::Fp32).unwrap())));
    }

    #[test]
    fn a100_80gb_has_its_datasheet_numbers() {
        let a100 = DeviceCatalog::builtin().get("a100-sxm4-80gb").unwrap();
        assert_eq!(a100.display_name, "A100-SXM4-80GB");
        assert_eq!(tflops(a100.peak(Dtype::Fp64).unwrap()), 19.5);
        assert_eq!(tflops(a100.peak(Dtype::Fp32).unwrap()), 19.5);
        assert_eq!(tflops(a100.peak(Dtype::Tf32).unwrap()), 156.0);
        assert_eq!(tflops(a100.peak(Dtype::Fp16).unwrap()), 312.0);
        assert_eq!(tflops(a100.peak(Dtype::Bf16).unwrap()), 312.0);
        assert_eq!(a100.memory_bandwidth.bytes_per_second(), 2039e9);
        assert_eq!(a100.memory_capacity, Bytes(80 << 30));
        assert_eq!(a100.nvlink_bandwidth.unwrap().bytes_per_second(), 600e9);
        assert_eq!(a100.pcie_bandwidth.bytes_per_second(), 31.5e9);
        let a100_40 = DeviceCatalog::builtin().get("a100-sxm4-40gb").unwrap();
        assert_eq!(a100_40.memory_bandwidth.bytes_per_second(), 1555e9);
        assert_eq!(a100_40.memory_capacity, Bytes(40 << 30));
    }

    #[test]
    fn h100_and_v100_use_dense_rates() {
        let catalog = DeviceCatalog::builtin();
        let h100 = catalog.get("h100-sxm5-80gb").unwrap();
        assert_eq!(tflops(h100.peak(Dtype::Fp16).unwrap()), 989.4);
        assert_eq!(tflops(h100.peak(Dtype::Fp8).unwrap()), 1978.9);
        assert_eq!(tflops(h100.peak(Dtype::Tf32).unwrap()), 494.7);
        assert_eq!(h100.memory_bandwidth.bytes_per_second(), 3.35e12);
        let v100 = catalog.get("v100-sxm2-16gb").unwrap();
        assert_eq!(tflops(v100.peak(Dtype::Fp16).unwrap()), 125.0);
        assert_eq!(v100.memory_capacity, Bytes(16 << 30));
        assert_eq!(catalog.get("v100-sxm2-32gb").unwrap().memory_capacity, Bytes(32 << 30));
    }

    #[test]
    fn lookup_ignores_case_and_unknown_names_list_the_known_ones() {
        let catalog = DeviceCatalog::builtin();
        assert_eq!(catalog.get("A100-SXM4-80GB").unwrap().name, "a100-sxm4-80gb");
        let error = catalog.get("a100").unwrap_err().to_string();
        assert!(error.contains("\"a100\"") && error.contains("a100-sxm4-40gb, a100-sxm4-80gb"), "{error}");
    }

    #[test]
    fn missing_dtype_names_device_dtype_and_alternatives() {
        let v100 = DeviceCatalog::builtin().get("v100-sxm2-32gb").unwrap();
        let error = v100.peak(Dtype::Bf16).unwrap_err().to_string();
        assert_eq!(error, "device v100-sxm2-32gb has no bf16 rate; it has: fp64, fp32, fp16");
    }

    #[test]
    fn dtypes_parse_print_and_size() {
        for dtype in Dtype::ALL {
            assert_eq!(dtype.to_string().parse::<Dtype>().unwrap(), dtype);
        }
        assert_eq!("BF16".parse::<Dtype>().unwrap(), Dtype::Bf16);
        assert_eq!(Dtype::Tf32.bytes(), 4);
        assert_eq!(Dtype::Fp8.bytes(), 1);
        assert_eq!(Dtype::Fp64.bytes(), 8);
        let error = "half".parse::<Dtype>().unwrap_err().to_string();
        assert!(error.contains("\"half\"") && error.contains("fp16"), "{error}");
    }

    const ONE_DEVICE: &str = r#"
        [[device]]
        name = "toy"
        display-name = "Toy"
        source = "made up for a test"
        memory-bandwidth = "100 GB/s"
        memory-capacity = "8 GiB"
        pcie-bandwidth = "15.75 GB/s"
        [device.peak]
        fp32 = "10 TFLOP/s"
    "#;

    #[test]
    fn user_catalogs_load_and_nvlink_is_optional() {
        let catalog = DeviceCatalog::from_toml_str(ONE_DEVICE).unwrap();
        let toy = catalog.get("TOY").unwrap();
        assert_eq!(toy.nvlink_bandwidth, None);
        assert_eq!(toy.memory_capacity, Bytes(8 << 30));
    }

    #[test]
    fn bad_catalogs_say_what_is_wrong() {
        let unknown_key = ONE_DEVICE.replace("pcie-bandwidth", "pcie-speed");
        let error = DeviceCatalog::from_toml_str(&unknown_key).unwrap_err().to_string();
        assert!(error.contains("pcie-speed"), "{error}");

        let bad_unit = ONE_DEVICE.replace("\"100 GB/s\"", "\"100 GBps\"");
        let error = DeviceCatalog::from_toml_str(&bad_unit).unwrap_err().to_string();
        assert!(error.contains("GBps") && error.contains("GB/s"), "{error}");

        let bad_dtype = ONE_DEVICE.replace("fp32 =", "int8 =");
        let error = DeviceCatalog::from_toml_str(&bad_dtype).unwrap_err().to_string();
        assert!(error.contains("int8") && error.contains("bf16"), "{error}");

        let twice = format!("{ONE_DEVICE}{}", ONE_DEVICE.replace("\"toy\"", "\"TOY\""));
        let error = DeviceCatalog::from_toml_str(&twice).unwrap_err().to_string();
        assert!(error.contains("twice"), "{error}");

        let both_links = ONE_DEVICE.replace(
            "pcie-bandwidth",
            "nvlink-bandwidth = \"600 GB/s\"\ninfinity-fabric-bandwidth = \"800 GB/s\"\npcie-bandwidth",
        );
        let error = DeviceCatalog::from_toml_str(&both_links).unwrap_err().to_string();
        assert!(error.contains("infinity-fabric-bandwidth") && error.contains("one kind"), "{error}");

        let no_peak = ONE_DEVICE.replace("fp32 = \"10 TFLOP/s\"", "");
        let error = DeviceCatalog::from_toml_str(&no_peak).unwrap_err().to_string();
        assert!(error.contains("`peak`") && error.contains("toy"), "{error}");

        let execution = format!(
            "{ONE_DEVICE}\n[device.execution]\nsm-count = 0\nboost-clock-mhz = 1000\nl2-cache = \"1 MiB\"\nmatrix-dtypes = []\nsource = \"x\""
        );
        let error = DeviceCatalog::from_toml_str(&execution).unwrap_err().to_string();
        assert!(error.contains("sm-count"), "{error}");
        let matrix = execution.replace("sm-count = 0", "sm-count = 8").replace("[]", "[\"fp16\"]");
        let error = DeviceCatalog::from_toml_str(&matrix).unwrap_err().to_string();
        assert!(error.contains("matrix-dtypes"), "{error}");
        let conv_tiles = execution.replace("sm-count = 0", "sm-count = 8\nconv-tiles = [[128, 0]]");
        let error = DeviceCatalog::from_toml_str(&conv_tiles).unwrap_err().to_string();
        assert!(error.contains("conv-tiles") && error.contains("positive"), "{error}");
        // A sustained fraction must be in (0, 1] and name its measurement.
        let good = execution.replace("sm-count = 0", "sm-count = 8");
        let device = DeviceCatalog::from_toml_str(&good).unwrap();
        let fraction = device.get("toy").unwrap().execution.as_ref().unwrap().matrix_sustained_fraction;
        assert_eq!(fraction, 1.0, "the datasheet's rate unless measured");
        for bad in ["0", "-0.5", "1.2", "nan"] {
            let text =
                good.replace("sm-count = 8", &format!("sm-count = 8\nmatrix-sustained-fraction = {bad}"));
            let error = DeviceCatalog::from_toml_str(&text).unwrap_err().to_string();
            assert!(
                error.contains("matrix-sustained-fraction") && error.contains("(0, 1]"),
                "{bad}: {error}"
            );
        }
        let unsourced = good.replace("sm-count = 8", "sm-count = 8\nmatrix-sustained-fraction = 0.9");
        let error = DeviceCatalog::from_toml_str(&unsourced).unwrap_err().to_string();
        assert!(error.contains("matrix-sustained-source"), "{error}");
        let sourced =
            unsourced.replace("sm-count = 8", "sm-count = 8\nmatrix-sustained-source = \"a measurement\"");
        let catalog = DeviceCatalog::from_toml_str(&sourced).unwrap();
        let execution = catalog.get("toy").unwrap().execution.as_ref().unwrap();
        assert_eq!(execution.matrix_sustained_fraction, 0.9);
    }

    /// The A100 SXM4 boards (a public measurement of the 80 GB one) and the Hopper SXM parts
    /// (measured on an H200 by tools/device/h200_measure.py) have sustained matrix rates below
    /// 1, each naming its measurement; the Hopper parts also an fp8 share and an unaligned share. Every other
    /// device runs at its datasheet rate.
    #[test]
    fn sustained_matrix_fractions_are_sourced() {
        let catalog = DeviceCatalog::builtin();
        for device in catalog.devices() {
            let Some(execution) = &device.execution else { continue };
            let fraction = execution.matrix_sustained_fraction;
            match device.name.as_str() {
                // The 40 GB SXM4 board takes the 80 GB one's share: same die, clock and power.
                "a100-sxm4-80gb" | "a100-sxm4-40gb" => {
                    assert!(fraction < 1.0 && execution.matrix_sustained_source.contains("230 TFLOP/s"));
                }
                "h100-sxm5-80gb" | "h200-sxm-141gb" => {
                    assert!(fraction < 1.0 && execution.matrix_sustained_source.contains("671.2 TFLOP/s"));
                    assert!(execution.fp8_sustained_source.contains("1233.0 TFLOP/s"), "{}", device.name);
                    assert!(execution.fp8_sustained_fraction.is_some_and(|fp8| fp8 < fraction));
                    assert!(execution.unaligned_matrix_source.contains("94.9 TFLOP/s"), "{}", device.name);
                }
                _ => {
                    assert_eq!(fraction, 1.0, "{}", device.name);
                    assert_eq!(execution.unaligned_matrix_fraction, None, "{}", device.name);
                }
            }
        }
    }

    /// `unaligned-matrix-fraction` is checked like the sustained shares: in (0, 1], sourced.
    #[test]
    fn unaligned_matrix_fractions_are_in_range_and_sourced() {
        let execution = format!(
            "{ONE_DEVICE}\n[device.execution]\nsm-count = 8\nboost-clock-mhz = 1000\nl2-cache = \"1 MiB\"\nmatrix-dtypes = []\nsource = \"x\""
        );
        for bad in ["0", "1.5", "nan"] {
            let text = execution.replace(
                "sm-count = 8",
                &format!("sm-count = 8\nunaligned-matrix-fraction = {bad}\nunaligned-matrix-source = \"m\""),
            );
            let error = DeviceCatalog::from_toml_str(&text).unwrap_err().to_string();
            assert!(error.contains("unaligned-matrix-fraction"), "{bad}: {error}");
        }
        let unsourced = execution.replace("sm-count = 8", "sm-count = 8\nunaligned-matrix-fraction = 0.2");
        let error = DeviceCatalog::from_toml_str(&unsourced).unwrap_err().to_string();
        assert!(error.contains("unaligned-matrix-source"), "{error}");
        let sourced = unsourced.replace("sm-count = 8", "sm-count = 8\nunaligned-matrix-source = \"m\"");
        let catalog = DeviceCatalog::from_toml_str(&sourced).unwrap();
        let execution = catalog.get("toy").unwrap().execution.as_ref().unwrap();
        assert_eq!(execution.unaligned_matrix_fraction, Some(0.2));
        // It applies to matrix-unit dtypes only: `toy` lists none.
        assert_eq!(execution.unaligned_fraction(Dtype::Fp16), 1.0);
    }
}
