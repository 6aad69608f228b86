//! The shapes of matrix-product kernels: what the compute model needs to price tile and wave
//! quantization, thin products and convolution algorithms (`docs/compute-model.md`, "Shapes").
//!
//! A [`KernelShape`] travels with a kernel's FLOPs and bytes in [`crate::KernelWork`]. Layers
//! give theirs through [`KernelShape::of_layer`] (from their per-sample input and output shapes,
//! which the lowering has already divided over tensor-parallel ranks); kernel benchmarks and
//! profiled operators give theirs directly.

use serde::Serialize;

use crate::layer::{Layer, LayerKind, Pass};

/// How an operand of a product is laid out in memory: contiguous along the reduction (`k`) or
/// along its own side of the output (`m` for A, `n` for B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Major {
    /// Consecutive elements run along `k`: each output row's (or column's) operand vector is
    /// one contiguous run, read as a dot product.
    Reduction,
    /// Consecutive elements run along the output side: a warp reads 32 neighbouring rows (or
    /// columns) at the same `k`, as a GEMV with `N` reads its matrix.
    Output,
}

/// The memory layout of a product's two operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GemmLayout {
    /// A (`m x k`).
    pub a: Major,
    /// B (`k x n`).
    pub b: Major,
}

impl GemmLayout {
    /// The layout BLAS's column-major `transa`/`transb` flags name (DeepBench's `NN`, `TN`,
    /// `NT` columns): A untransposed is stored `m x k` column-major (contiguous along `m`),
    /// transposed contiguous along `k`; B untransposed is stored `k x n` column-major
    /// (contiguous along `k`), transposed contiguous along `n`.
    pub const fn blas(transa: bool, transb: bool) -> GemmLayout {
        GemmLayout {
            a: if transa { Major::Reduction } else { Major::Output },
            b: if transb { Major::Output } else { Major::Reduction },
        }
    }

    /// BLAS's `[transa, transb]` flags of this layout, the inverse of [`GemmLayout::blas`].
    pub fn blas_flags(&self) -> [bool; 2] {
        [self.a == Major::Reduction, self.b == Major::Output]
    }

    /// The layouts PyTorch's `nn.Linear` (and Chainer's `Linear`, both row-major) give the
    /// three products of a layer, in [`KernelShape::of_layer`]'s orientation (forward
    /// `tokens x out` from `tokens x in`): the activations `x` and the weights `W` (`out x in`)
    /// are stored row-major, so the forward reads both along `in`, the reduction (BLAS `TN`,
    /// the `*_tn` kernels of a forward in public profiles); backward-data `dy W` reads `dy`
    /// along `out`, its reduction, and `W` along `in`, its output side (`NN` in BLAS's
    /// swapped orientation); backward-weight `dy^T x` reads both along their output sides
    /// (`NT`).
    pub const fn row_major_linear(pass: Pass) -> GemmLayout {
        match pass {
            Pass::Forward => GemmLayout { a: Major::Reduction, b: Major::Reduction },
            Pass::BackwardData => GemmLayout { a: Major::Reduction, b: Major::Output },
            Pass::BackwardWeight => GemmLayout { a: Major::Output, b: Major::Output },
        }
    }
}

/// A (batched) matrix product `C[m, n] = A[m, k] B[k, n]`, `batch` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GemmShape {
    /// Independent products of the same shape (batched GEMM, groups, attention heads).
    pub batch: u64,
    /// Rows of the output.
    pub m: u64,
    /// Columns of the output.
    pub n: u64,
    /// The reduction dimension.
    pub k: u64,
    /// The operands' layout, where known (a kernel benchmark's row, a framework's linear
    /// layer); `None` prices the product without a layout effect.
    pub layout: Option<GemmLayout>,
}

/// A product is thin when its narrower output side has at most this many rows or columns: it
/// streams its wide operand like a GEMV (DeepBench's `N = 16, 32, 64` products, the shape
/// regime `calibrate --check` reports as "gemm thin").
pub const THIN_GEMM_SIDE: u64 = 64;

impl GemmShape {
    /// One product of `m x k` by `k x n`.
    pub const fn new(m: u64, n: u64, k: u64) -> GemmShape {
        GemmShape { batch: 1, m, n, k, layout: None }
    }

    /// The same product with its operands' layout.
    pub const fn with_layout(self, layout: GemmLayout) -> GemmShape {
        GemmShape { layout: Some(layout), ..self }
    }

    /// Whether the product is thin ([`THIN_GEMM_SIDE`]) and its wide operand (A when `n` is
    /// the thin side, B when `m` is) is stored contiguous along the reduction: each of the
    /// wide side's rows is then a contiguous dot product, not the coalesced column walk of a
    /// GEMV with `N`. `calibrate` fits the rate of such products relative to the others,
    /// `k-major-thin-gemm-efficiency`; products without a layout are not.
    pub fn thin_and_k_major(&self) -> bool {
        let Some(layout) = self.layout else { return false };
        if self.m.min(self.n) > THIN_GEMM_SIDE {
            return false;
        }
        let wide = if self.n <= self.m { layout.a } else { layout.b };
        wide == Major::Reduction
    }

    /// Multiply-adds counted as 2 FLOPs each.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// A reduction by PyTorch's TensorIterator reduction kernel (`at::native::reduce_kernel`, in
/// `aten/src/ATen/native/cuda/Reduce.cuh`, which `sum`, `mean`, `amax`, `norm` and the other
/// reductions of `aten/src/ATen/native/cuda/Reduce*.cu` launch): `outputs` results, each
/// combining `inputs_per_output` values. Its launch ([`ReductionShape::launch`]) decides how
/// many values each thread reads one after the other, and a reduction with few outputs and
/// long columns is bound by those dependent rounds of memory latency, not by bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReductionShape {
    /// Results: the elements of the output (1 for a reduction of the whole tensor).
    pub outputs: u64,
    /// Values combined into each result.
    pub inputs_per_output: u64,
    /// Whether the reduced values are contiguous in memory (a sum along the last dimension, a
    /// reduction of the whole tensor); false when the outputs are the contiguous dimension and
    /// each is reduced across rows (a bias gradient: `[rows, columns]` summed over the rows).
    pub contiguous: bool,
    /// Loads a thread issues before it waits for them: the kernel's `vt0` template argument,
    /// 4 for every reduction but Welford's (`ReduceOp<..., vt0>` in the kernel's name).
    pub unroll: u64,
}

/// How PyTorch launches a [`ReductionShape`] on a device, from `setReduceConfig` in
/// `Reduce.cuh` (PyTorch 1.12 to 2.x).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReductionLaunch {
    /// Thread blocks: `[x, y]`, x over groups of outputs, y over slices of each reduction.
    pub grid: [u64; 2],
    /// Threads of a block: `[x, y]`.
    pub block: [u64; 2],
    /// Outputs each thread's vector loads cover (`output_vec_size`: 4, 2 or 1).
    pub output_vector: u64,
    /// Rounds of loads each thread waits on, one after the other, waves of blocks included:
    /// its values (`values_per_thread`) over the loads it keeps in flight, plus two for the
    /// blocks' combine through global memory when a reduction is split across blocks.
    pub rounds: u64,
}

/// `Reduce.cuh`'s `MAX_NUM_THREADS` for every dtype but complex double.
const REDUCE_MAX_THREADS: u64 = 512;
/// Threads a multiprocessor holds (`maxThreadsPerMultiProcessor`): 2048 on the data-centre
/// GPUs of compute capability 6.0, 7.0, 8.0 and 9.0 (CUDA C++ Programming Guide, "Technical
/// Specifications per Compute Capability").
const THREADS_PER_SM: u64 = 2048;

impl ReductionShape {
    /// The launch `setReduceConfig` chooses on a device with `sm_count` multiprocessors
    /// (assuming an aligned base address, as the caching allocator gives). Block width goes
    /// along the contiguous dimension (inputs if `contiguous`, else outputs, loaded 4, 2 or 1
    /// at a time), height along the rest; a reduction of at least 16 values per thread is
    /// split across the block's rows, and one of at least 256 across blocks too (up to the
    /// device's resident blocks).
    pub fn launch(&self, sm_count: u32) -> ReductionLaunch {
        // floor(log2) as a power of two, at least 1 (`last_pow2`).
        let last_pow2 = |n: u64| if n <= 1 { 1 } else { 1u64 << (63 - n.leading_zeros()) };
        let outputs = self.outputs.max(1);
        let inputs = self.inputs_per_output.max(1);
        let unroll = self.unroll.max(1);
        // "Vectorize along input" (4 values per load) or "along output".
        let vectorized = self.contiguous && inputs > 128 && unroll >= 4;
        let output_vector =
            if self.contiguous { 1 } else { [4, 2, 1].into_iter().find(|v| outputs % v == 0).unwrap_or(1) };
        let (dim0, dim1) = if self.contiguous {
            (if vectorized { inputs / 4 } else { inputs }, outputs)
        } else {
            (outputs / output_vector, inputs)
        };
        // `set_block_dimension`.
        let max_threads = REDUCE_MAX_THREADS / output_vector;
        let dim0_pow2 = if dim0 < max_threads { last_pow2(dim0) } else { max_threads };
        let dim1_pow2 = if dim1 < max_threads { last_pow2(dim1) } else { max_threads };
        let width = dim0_pow2.min(32);
        let height = dim1_pow2.min(max_threads / width);
        let width = dim0_pow2.min(max_threads / height);
        let (mut step_input, mut step_output) = (1u64, 1u64);
        if self.contiguous {
            step_input *= width;
        } else {
            step_output *= width;
        }
        let per_thread = |step: u64| inputs.div_ceil(step);
        let split_rows = per_thread(step_input) >= height * 16 || per_thread(step_input) >= 256;
        if split_rows {
            step_input *= height;
        } else {
            step_output *= height;
        }
        let grid_x = (outputs / output_vector).div_ceil(step_output).max(1);
        let resident = u64::from(sm_count.max(1)) * (THREADS_PER_SM / (width * height)).max(1);
        let mut blocks_per_output = 1;
        if split_rows && per_thread(step_input) >= 256 && grid_x <= resident {
            let values = per_thread(step_input);
            blocks_per_output = resident.div_ceil(grid_x).min(values.div_ceil(16)).max(values.div_ceil(256));
            if blocks_per_output > 1 {
                step_input *= blocks_per_output;
            }
        }
        let in_flight = if vectorized { 4 } else { unroll };
        let global = if blocks_per_output > 1 { 2 } else { 0 };
        let waves = (grid_x * blocks_per_output).div_ceil(resident);
        ReductionLaunch {
            grid: [grid_x, blocks_per_output],
            block: [width, height],
            output_vector,
            rounds: (per_thread(step_input).div_ceil(in_flight) + global) * waves,
        }
    }
}

/// Which of a convolution's three training computations a kernel is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConvDirection {
    /// Output from input ("fprop").
    Forward,
    /// Input gradient from output gradient ("dgrad").
    BackwardData,
    /// Weight gradient from input and output gradient ("wgrad").
    BackwardWeight,
}

impl From<Pass> for ConvDirection {
    fn from(pass: Pass) -> ConvDirection {
        match pass {
            Pass::Forward => ConvDirection::Forward,
            Pass::BackwardData => ConvDirection::BackwardData,
            Pass::BackwardWeight => ConvDirection::BackwardWeight,
        }
    }
}

/// Images per group in the transformed tiles of cuDNN's Winograd through memory
/// (`WINOGRAD_NONFUSED`, forward and backward-data): its batched products count the batch
/// rounded up to a multiple of it ([`ConvShape::winograd`] cites the profile that shows it).
pub const WINOGRAD_NONFUSED_IMAGE_GROUP: u64 = 16;

/// The output tile of cuDNN's Winograd through memory for 3x3 filters: F(4x4, 3x3), 6 x 6
/// input tiles and 36 batched products. Its kernels are named by the output tile
/// (`winogradForwardData4x4`, `winogradForwardOutput4x4`), and Nsight Compute shows the batched
/// SGEMM between them on a grid of 36 products ([`ConvShape::winograd`] cites the profile).
pub const WINOGRAD_NONFUSED_TILE: u64 = 4;

/// A 1-, 2- or 3-D convolution over a batch, spatial axes padded to three with 1s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConvShape {
    /// Samples.
    pub batch: u64,
    /// Input channels (all groups).
    pub in_channels: u64,
    /// Output channels (all groups).
    pub out_channels: u64,
    /// Channel groups (1: dense).
    pub groups: u64,
    /// Input size per spatial axis.
    pub input: [u64; 3],
    /// Output size per spatial axis.
    pub output: [u64; 3],
    /// Kernel size per spatial axis (dilation included in the output size, not here).
    pub kernel: [u64; 3],
    /// Stride per spatial axis.
    pub stride: [u64; 3],
}

impl ConvShape {
    fn product(values: [u64; 3]) -> u64 {
        values.iter().product()
    }

    /// The implicit GEMM that computes `direction` (NVIDIA, *Convolutional Layers User's
    /// Guide*, "Convolution Algorithms"), channels padded to multiples of `channel_grid`
    /// (the vector width the kernels need):
    /// - forward: `m = N·P·Q(·O)`, `n = K`, `k = C·R·S(·T)`;
    /// - backward-data: `m = N·H·W(·D)`, `n = C`, `k = K · Π ceil(R/stride)`: a strided
    ///   convolution's input position receives `ceil(R/stride)` taps per axis (and a kernel
    ///   narrower than its stride reaches only `P·R` of the `H` positions per axis);
    /// - backward-weight: `m = K`, `n = C·R·S(·T)`, `k = N·P·Q(·O)`.
    ///
    /// Groups multiply the batch of products and divide the channels.
    pub fn implicit_gemm(&self, direction: ConvDirection, channel_grid: u64) -> GemmShape {
        let groups = self.groups.max(1);
        let grid = channel_grid.max(1);
        let c = (self.in_channels / groups).div_ceil(grid) * grid;
        let k_out = (self.out_channels / groups).div_ceil(grid) * grid;
        let taps = Self::product(self.kernel);
        let outputs = self.batch * Self::product(self.output);
        let (m, n, k) = match direction {
            ConvDirection::Forward => (outputs, k_out, c * taps),
            ConvDirection::BackwardData => {
                let strided_taps: u64 =
                    (0..3).map(|axis| self.kernel[axis].div_ceil(self.stride[axis].max(1))).product();
                // A kernel narrower than its stride leaves input positions no output reads:
                // their gradient is zero, written but not computed.
                let reached: u64 =
                    (0..3).map(|axis| self.input[axis].min(self.output[axis] * self.kernel[axis])).product();
                (self.batch * reached, c, k_out * strided_taps)
            }
            ConvDirection::BackwardWeight => (k_out, c * taps, outputs),
        };
        GemmShape { batch: groups, m, n, k, layout: None }
    }

    /// A backward-data pass whose kernel is narrower than its stride on some axis (a 1x1
    /// stride-2 layer): `(whole, unreached)`, the input gradient's elements and those of the
    /// positions no output reads. The implicit GEMM computes only the reached positions
    /// ([`ConvShape::implicit_gemm`]); the others' gradient is zero and must be written. Two
    /// public designs: Composable Kernel's 1x1 stride-2 backward-data writes only the reached
    /// positions and failed verification until the whole input gradient was zeroed first, by a
    /// kernel of its own ("reset input to zero": github.com/ROCm/composable_kernel, issue #105
    /// and pull request #132, whose review asks for a GPU kernel that sets the buffer to 0);
    /// CUTLASS's strided backward-data writes the unreached positions' zeros from its own thread
    /// blocks (`include/cutlass/conv/kernel/implicit_gemm_convolution_strided_dgrad.h`: a block
    /// whose filter phase has no taps skips its main loop and stores its empty accumulators).
    /// `None` for other directions and for kernels that reach every input position (the reach
    /// ignores padding, as [`ConvShape::implicit_gemm`]'s does).
    pub fn unreached_input_gradient(&self, direction: ConvDirection) -> Option<(u64, u64)> {
        let all = Self::product(self.input);
        let reached: u64 =
            (0..3).map(|axis| self.input[axis].min(self.output[axis] * self.kernel[axis])).product();
        let per_position = self.batch * self.in_channels;
        (direction == ConvDirection::BackwardData && reached < all)
            .then(|| (per_position * all, per_position * (all - reached)))
    }

    /// Whether Winograd's minimal filtering applies: a dense 2-D 3x3 convolution with unit
    /// stride (cuDNN's and MIOpen's Winograd kernels).
    pub fn winograd_applies(&self) -> bool {
        self.groups == 1 && self.kernel == [3, 3, 1] && self.stride == [1, 1, 1]
    }

    /// The batched products of Winograd F(`m`x`m`, 3x3) through memory (cuDNN's
    /// `WINOGRAD_NONFUSED`) for `direction`: `(m + 2)^2` independent products over the
    /// output's `m x m` tiles, and the elements its transform kernels read and write: the input
    /// and output (or gradients), the filter, and the three transformed tensors (input and output
    /// tiles, `(m + 2)^2 · C·K` filter elements) each once, written by one kernel; the product
    /// reads or writes them under its compute time, as any GEMM's operands (Lavin and Gray 2016,
    /// "Fast Algorithms for Convolutional Neural Networks": the filter transform `G g G^T` per
    /// input and output channel).
    ///
    /// Forward and backward-data lay the transformed tiles out in groups of
    /// [`WINOGRAD_NONFUSED_IMAGE_GROUP`] images, so their products and transformed tiles count
    /// the batch rounded up to it: a batch of 8 costs the products of 16. Nsight Compute shows
    /// it for cuDNN's kernels on 10 images of 224x224, 128 to 128 channels (kernyan.com,
    /// "Conv2D GPU Baselines: cuDNN and CUTLASS Performance and Analysis (Part 2)", 2025):
    /// `winogradForwardData4x4` runs 196 x 128 blocks of 256 threads (16 tiles of 16 images per
    /// block and channel), the batched `volta_sgemm_128x64_nn` a 392 x 2 x 36 grid (36 products of
    /// 392 x 128 = 50176 = 16 x 3136 tile rows, not 10 x 3136) and 29.8 billion FP32
    /// instructions, 36 x 50176 x 128 x 128 (10 images' tiles would be 18.5 billion).
    /// Backward-weight runs other kernels (`winogradWgradData4x4`, `winogradWgradDelta4x4`,
    /// `winogradWgradOutput4x4`), whose layout nothing public shows: it counts the batch as it is.
    pub fn winograd(&self, direction: ConvDirection, tile: u64) -> (GemmShape, f64) {
        let images = match direction {
            ConvDirection::Forward | ConvDirection::BackwardData => {
                self.batch.div_ceil(WINOGRAD_NONFUSED_IMAGE_GROUP) * WINOGRAD_NONFUSED_IMAGE_GROUP
            }
            ConvDirection::BackwardWeight => self.batch,
        };
        self.winograd_over(direction, tile, images)
    }

    /// Winograd F(`tile`x`tile`, 3x3)'s batched products and transform traffic over `images`
    /// images' tiles (the plain tensors count the real batch).
    fn winograd_over(&self, direction: ConvDirection, tile: u64, images: u64) -> (GemmShape, f64) {
        let alpha = tile + 2;
        let tiles = images * self.output[0].div_ceil(tile) * self.output[1].div_ceil(tile);
        let (c, k) = (self.in_channels, self.out_channels);
        let (m, n, depth) = match direction {
            ConvDirection::Forward => (tiles, k, c),
            ConvDirection::BackwardData => (tiles, c, k),
            ConvDirection::BackwardWeight => (k, c, tiles),
        };
        let shape = GemmShape { batch: alpha * alpha, m, n, k: depth, layout: None };
        let transformed = alpha * alpha * (tiles * (c + k) + c * k);
        (shape, (self.plain_elements() + transformed) as f64)
    }
    /// cuDNN's fused Winograd (`CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD` and its backward-data
    /// twin; backward-weight has none): F(2x2, 3x3) with the data and output transforms inside
    /// the kernel that does the 16 batched products (`winograd3x3Kernel`,
    /// `*_scudnn_winograd_128x128_*`), after one kernel that transforms the filter
    /// (`generateWinogradTilesKernel`, in the same listings). Returns the products and the
    /// elements moved through memory: the input and output (or gradients) and the filter once,
    /// and the 16 `C·K` transformed filter tiles written and read back. `None` for
    /// backward-weight.
    pub fn fused_winograd(&self, direction: ConvDirection) -> Option<(GemmShape, f64)> {
        if direction == ConvDirection::BackwardWeight {
            return None;
        }
        let (product, _) = self.winograd_over(direction, 2, self.batch);
        let (c, k) = (self.in_channels, self.out_channels);
        Some((product, (self.plain_elements() + 2 * product.batch * c * k) as f64))
    }

    /// Whether cuDNN's FFT convolutions apply: a dense 2-D convolution with unit stride
    /// (`CUDNN_CONVOLUTION_*_ALGO_FFT` and `FFT_TILING` need stride 1).
    pub fn fft_applies(&self) -> bool {
        self.groups == 1 && self.stride == [1, 1, 1] && self.is_two_d()
    }

    /// Whether the convolution is 1- or 2-D (its third spatial axis is padding).
    pub fn is_two_d(&self) -> bool {
        self.kernel[2] == 1 && self.output[2] == 1
    }

    /// Elements of the plain tensors a transformed algorithm (Winograd, fused or not) reads and
    /// writes once: the input and the output (or their gradients) and the filter.
    fn plain_elements(&self) -> u64 {
        let (c, k) = (self.in_channels, self.out_channels);
        self.batch * (c * Self::product(self.input) + k * Self::product(self.output))
            + c * k * Self::product(self.kernel)
    }

    /// cuDNN's FFT convolution for `direction` on `size x size` transforms (its kernels
    /// `fft2d_r2c_16x16`, `fft2d_r2c_32x32`, `fft2d_c2r_32x32`, public TensorFlow and PyTorch
    /// profiles): the padded input is cut into tiles of `size` that each give
    /// `size - R + 1` outputs per axis (one tile when the whole padded input fits: cuDNN's
    /// `FFT`; several: `FFT_TILING`), input, filter and output (or their gradients) go through
    /// real-to-complex transforms of `size x (size/2 + 1)` frequencies, and a batched complex
    /// product per frequency (`*_cgemm_*_tn`, with `compute_gemm_pointers`) does the
    /// convolution. Returns that product (its complex multiply-adds as real ones: the caller
    /// prices it four times) and the elements the transform kernels read and write: the plain
    /// tensors once and the transformed ones (two elements per frequency) once, as Winograd's.
    /// `None` when the filter does not fit the transform.
    pub fn fft(&self, direction: ConvDirection, size: u64) -> Option<(GemmShape, f64)> {
        let [r, s, _] = self.kernel;
        if r > size || s > size {
            return None;
        }
        let tiles =
            self.batch * self.output[0].div_ceil(size + 1 - r) * self.output[1].div_ceil(size + 1 - s);
        let frequencies = size * (size / 2 + 1);
        let (c, k) = (self.in_channels, self.out_channels);
        let (m, n, depth) = match direction {
            ConvDirection::Forward => (tiles, k, c),
            ConvDirection::BackwardData => (tiles, c, k),
            ConvDirection::BackwardWeight => (k, c, tiles),
        };
        let shape = GemmShape { batch: frequencies, m, n, k: depth, layout: None };
        let filter = c * k * Self::product(self.kernel);
        let plain = self.batch * (c * Self::product(self.input) + k * Self::product(self.output)) + filter;
        let transformed = 2 * frequencies * (tiles * (c + k) + c * k);
        Some((shape, (plain + transformed) as f64))
    }
}

/// Scaled dot-product attention's two products per head: scores `Q·K^T` (`s x s_kv` over the
/// head size) and the weighted sum `P·V`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AttentionShape {
    /// Samples times query heads.
    pub heads: u64,
    /// Query positions.
    pub queries: u64,
    /// Key and value positions.
    pub keys: u64,
    /// Head size of the queries and keys.
    pub head_dim: u64,
    /// Head size of the values where it differs (multi-head latent attention); `None`:
    /// `head_dim`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_dim: Option<u64>,
    /// One fused (flash) kernel, whose products run at `flash-attention-efficiency` of the
    /// GEMM ceiling; false for the separate cuBLAS products of a standard core.
    #[serde(skip)]
    pub fused: bool,
}

impl AttentionShape {
    /// The two products of the forward pass; the backward runs two of each shape.
    pub fn products(&self) -> [GemmShape; 2] {
        [
            GemmShape { batch: self.heads, m: self.queries, n: self.keys, k: self.head_dim, layout: None },
            GemmShape {
                batch: self.heads,
                m: self.queries,
                n: self.value_dim.unwrap_or(self.head_dim),
                k: self.keys,
                layout: None,
            },
        ]
    }
}

/// The shape of a kernel, when it has one the model can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum KernelShape {
    /// No shape: the kernel is priced by its FLOPs and bytes alone.
    #[default]
    Unknown,
    /// A (batched) matrix product.
    Gemm(GemmShape),
    /// A convolution in one direction.
    Conv {
        /// The convolution.
        shape: ConvShape,
        /// Which of its three computations.
        direction: ConvDirection,
    },
    /// Attention's products.
    Attention(AttentionShape),
    /// A reduction by PyTorch's TensorIterator reduction kernel.
    Reduction(ReductionShape),
}

impl KernelShape {
    /// The shape of `pass` of `layer` for `batch` samples: convolutions (transposed ones too),
    /// linear layers, matmuls, attention and MoE experts; [`KernelShape::Unknown`] for other
    /// layers.
    pub fn of_layer(layer: &Layer, pass: Pass, batch: u64) -> KernelShape {
        let input = &layer.input.0;
        let leading = |dims: &[u64]| dims.iter().product::<u64>() * batch;
        match &layer.kind {
            LayerKind::Conv { out_channels, kernel, stride, groups, .. } => {
                let axes = kernel.len();
                if !(1..=3).contains(&axes) || input.len() != axes + 1 || layer.output.0.len() != axes + 1 {
                    return KernelShape::Unknown;
                }
                let mut shape = ConvShape {
                    batch,
                    in_channels: input[0],
                    out_channels: *out_channels,
                    groups: *groups,
                    input: [1; 3],
                    output: [1; 3],
                    kernel: [1; 3],
                    stride: [1; 3],
                };
                for axis in 0..axes {
                    shape.input[axis] = input[axis + 1];
                    shape.output[axis] = layer.output.0[axis + 1];
                    shape.kernel[axis] = kernel[axis];
                    shape.stride[axis] = stride.get(axis).copied().unwrap_or(1);
                }
                KernelShape::Conv { shape, direction: pass.into() }
            }
            // A transposed convolution is the backward-data pass of the convolution that maps
            // its output back to its input, and its backward-data pass that convolution's
            // forward.
            LayerKind::ConvTranspose { out_channels, kernel, stride, groups, .. } => {
                let axes = kernel.len();
                if !(1..=3).contains(&axes) || input.len() != axes + 1 || layer.output.0.len() != axes + 1 {
                    return KernelShape::Unknown;
                }
                let mut shape = ConvShape {
                    batch,
                    in_channels: *out_channels,
                    out_channels: input[0],
                    groups: *groups,
                    input: [1; 3],
                    output: [1; 3],
                    kernel: [1; 3],
                    stride: [1; 3],
                };
                for axis in 0..axes {
                    shape.input[axis] = layer.output.0[axis + 1];
                    shape.output[axis] = input[axis + 1];
                    shape.kernel[axis] = kernel[axis];
                    shape.stride[axis] = stride.get(axis).copied().unwrap_or(1);
                }
                let direction = match pass {
                    Pass::Forward => ConvDirection::BackwardData,
                    Pass::BackwardData => ConvDirection::Forward,
                    Pass::BackwardWeight => ConvDirection::BackwardWeight,
                };
                KernelShape::Conv { shape, direction }
            }
            LayerKind::Linear { out_features, .. } | LayerKind::TiedLinear { out_features, .. } => {
                let Some((&features, rows)) = input.split_last() else { return KernelShape::Unknown };
                let tokens = leading(rows);
                let shape = match pass {
                    Pass::Forward => GemmShape::new(tokens, *out_features, features),
                    Pass::BackwardData => GemmShape::new(tokens, features, *out_features),
                    Pass::BackwardWeight => GemmShape::new(*out_features, features, tokens),
                };
                KernelShape::Gemm(shape.with_layout(GemmLayout::row_major_linear(pass)))
            }
            LayerKind::Matmul { other } => {
                let (Some(&n), true) = (other.0.last(), input.len() >= 2) else {
                    return KernelShape::Unknown;
                };
                let (m, k) = (input[input.len() - 2], input[input.len() - 1]);
                let products = leading(&input[..input.len() - 2]);
                let (m, n, k) = match pass {
                    Pass::Forward => (m, n, k),
                    // dA = dC B^T (and dB = A^T dC, the same work)
                    Pass::BackwardData | Pass::BackwardWeight => (m, k, n),
                };
                KernelShape::Gemm(GemmShape { batch: products, m, n, k, layout: None })
            }
            LayerKind::Attention { heads, kv_heads, implementation, value_head_dim, .. } => {
                let (Some(&features), Some(&tokens)) = (input.last(), input.first()) else {
                    return KernelShape::Unknown;
                };
                let Some((head_dim, value_dim)) =
                    crate::layer::attention_head_dims(features, *heads, *kv_heads, *value_head_dim)
                else {
                    return KernelShape::Unknown;
                };
                KernelShape::Attention(AttentionShape {
                    heads: batch * heads,
                    queries: tokens,
                    keys: tokens,
                    head_dim,
                    value_dim: value_head_dim.map(|_| value_dim),
                    fused: *implementation == crate::layer::AttentionKernel::Flash,
                })
            }
            LayerKind::MoeExperts { experts, top_k, ffn_hidden, .. } => {
                let Some((&hidden, rows)) = input.split_last() else { return KernelShape::Unknown };
                let routed = leading(rows) * top_k;
                let per_expert = routed.div_ceil((*experts).max(1));
                KernelShape::Gemm(match pass {
                    Pass::Forward | Pass::BackwardData => {
                        GemmShape { batch: *experts, m: per_expert, n: *ffn_hidden, k: hidden, layout: None }
                    }
                    Pass::BackwardWeight => {
                        GemmShape { batch: *experts, m: hidden, n: *ffn_hidden, k: per_expert, layout: None }
                    }
                })
            }
            _ => KernelShape::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layer::{Layer, LayerKind, Shape};

    #[test]
    fn layouts_tell_which_thin_products_read_their_wide_operand_along_k() {
        let (nn, tn, nt) =
            (GemmLayout::blas(false, false), GemmLayout::blas(true, false), GemmLayout::blas(false, true));
        assert_eq!(tn, GemmLayout { a: Major::Reduction, b: Major::Reduction });
        assert_eq!(nt, GemmLayout { a: Major::Output, b: Major::Output });
        for flags in [[false, false], [true, false], [false, true], [true, true]] {
            assert_eq!(GemmLayout::blas(flags[0], flags[1]).blas_flags(), flags);
        }
        let thin_n = GemmShape::new(7680, 16, 2560);
        assert!(thin_n.with_layout(tn).thin_and_k_major());
        assert!(!thin_n.with_layout(nn).thin_and_k_major());
        assert!(!thin_n.thin_and_k_major(), "no layout, no effect");
        // With a thin m the wide operand is B, along k in `NN` and `TN` alike.
        let thin_m = GemmShape::new(35, 8457, 2560);
        assert!(thin_m.with_layout(nn).thin_and_k_major() && thin_m.with_layout(tn).thin_and_k_major());
        assert!(!thin_m.with_layout(nt).thin_and_k_major());
        assert!(!GemmShape::new(65, 8457, 2560).with_layout(tn).thin_and_k_major());
        // A linear layer over 32 samples: its forward reads the weights along `in` (thin and
        // along k); its gradients read them along their output side.
        let fc = Layer::new("fc", LayerKind::Linear { out_features: 4096, bias: false }, Shape::from([9216]))
            .unwrap();
        let along_k = |pass| match KernelShape::of_layer(&fc, pass, 32) {
            KernelShape::Gemm(shape) => shape.thin_and_k_major(),
            other => panic!("{other:?}"),
        };
        assert!(along_k(Pass::Forward));
        assert!(!along_k(Pass::BackwardData) && !along_k(Pass::BackwardWeight));
    }

    #[test]
    fn reductions_launch_as_pytorch_launched_them_in_the_traces() {
        // Grid and block sizes Kineto recorded for `reduce_kernel` in HTA's `trace_diff` traces
        // (`control.json.gz`, A100 with 108 multiprocessors; `test.json.gz`, V100 with 80), for
        // the sums whose input shapes the operators give.
        let outer = |rows, columns| ReductionShape {
            outputs: columns,
            inputs_per_output: rows,
            contiguous: false,
            unroll: 4,
        };
        for sm_count in [80, 108] {
            // A bias gradient over 1024 rows of 96 columns: 2 blocks of 16 x 8 threads, each
            // thread summing 4 columns over 128 rows in 32 rounds of 4 loads.
            let bias = outer(1024, 96).launch(sm_count);
            assert_eq!((bias.grid, bias.block, bias.output_vector, bias.rounds), ([2, 1], [16, 8], 4, 32));
            let thin = outer(1024, 32).launch(sm_count);
            assert_eq!((thin.grid, thin.block, thin.rounds), ([1, 1], [8, 16], 16));
            // 256 or more values per thread: split across 16 blocks per column group, which
            // combine through global memory (the `Memset` before these kernels clears its
            // semaphores).
            let split = outer(1024, 256).launch(sm_count);
            assert_eq!((split.grid, split.block, split.rounds), ([2, 16], [32, 4], 4 + 2));
            assert_eq!(
                (outer(1024, 512).launch(sm_count).grid, outer(1024, 512).launch(sm_count).block),
                ([4, 16], [32, 4])
            );
            // An odd number of columns loads one output at a time.
            let odd = outer(1024, 1705).launch(sm_count);
            assert_eq!((odd.grid, odd.block, odd.output_vector), ([54, 1], [32, 16], 1));
            // A whole tensor of 1,003,520 values: 123 blocks of 512 threads, vector loads.
            let whole =
                ReductionShape { outputs: 1, inputs_per_output: 1_003_520, contiguous: true, unroll: 4 };
            let whole = whole.launch(sm_count);
            assert_eq!((whole.grid, whole.block, whole.rounds), ([1, 123], [512, 1], 4 + 2));
        }
        // Rounds are not monotonic in size: past 256 values per thread the reduction is split
        // across blocks. In the V100 trace the 393 kB sum over 1024 rows of 96 columns took
        // 26 us (median) and the 2.1 MB one of 512 columns 19 us.
        assert!(outer(1024, 512).launch(80).rounds < outer(1024, 96).launch(80).rounds);
    }

    #[test]
    fn convolutions_map_to_their_implicit_gemms() {
        let conv = Layer::new("conv", LayerKind::conv2d(128, 3, 2, 1), Shape::from([64, 56, 56])).unwrap();
        let KernelShape::Conv { shape, direction } = KernelShape::of_layer(&conv, Pass::Forward, 8) else {
            panic!("a convolution has a conv shape")
        };
        assert_eq!(direction, ConvDirection::Forward);
        assert_eq!((shape.output, shape.kernel, shape.stride), ([28, 28, 1], [3, 3, 1], [2, 2, 1]));
        assert_eq!(shape.implicit_gemm(ConvDirection::Forward, 1), GemmShape::new(8 * 28 * 28, 128, 64 * 9));
        // dgrad: every input position gets ceil(3 / 2)^2 = 4 taps.
        assert_eq!(
            shape.implicit_gemm(ConvDirection::BackwardData, 1),
            GemmShape::new(8 * 56 * 56, 64, 128 * 4)
        );
        assert_eq!(
            shape.implicit_gemm(ConvDirection::BackwardWeight, 1),
            GemmShape::new(128, 64 * 9, 8 * 28 * 28)
        );
        // Forward FLOPs are the layer's (less its bias).
        assert_eq!(shape.implicit_gemm(ConvDirection::Forward, 1).flops(), conv.cost.flops(Pass::Forward, 8));
        // Three input channels padded to 8 for fp16 kernels.
        let rgb = Layer::new("rgb", LayerKind::conv2d(64, 7, 2, 3), Shape::from([3, 224, 224])).unwrap();
        let KernelShape::Conv { shape, .. } = KernelShape::of_layer(&rgb, Pass::Forward, 1) else { panic!() };
        assert_eq!(shape.implicit_gemm(ConvDirection::Forward, 8).k, 8 * 49);
        assert!(!shape.winograd_applies());
    }

    #[test]
    fn winograd_through_memory_counts_the_batch_in_groups_of_sixteen_images() {
        let layer = Layer::new("conv", LayerKind::conv2d(512, 3, 1, 1), Shape::from([512, 14, 14])).unwrap();
        let shape = |batch| {
            let KernelShape::Conv { shape, .. } = KernelShape::of_layer(&layer, Pass::Forward, batch) else {
                panic!("a convolution has a conv shape")
            };
            shape
        };
        let (forward, data, weight) =
            (ConvDirection::Forward, ConvDirection::BackwardData, ConvDirection::BackwardWeight);
        // F(4x4, 3x3): 36 products over 4 x 4 = 16 tiles per 14x14 image; 8 images count 16.
        let (product, _) = shape(8).winograd(forward, 4);
        assert_eq!((product.batch, product.m, product.n, product.k), (36, 16 * 16, 512, 512));
        for direction in [forward, data] {
            for tile in [2, 4] {
                assert_eq!(shape(8).winograd(direction, tile).0, shape(16).winograd(direction, tile).0);
                assert_eq!(shape(1).winograd(direction, tile).0, shape(16).winograd(direction, tile).0);
                // 17 images take two groups: the products of 32.
                assert_eq!(shape(17).winograd(direction, tile).0, shape(32).winograd(direction, tile).0);
                // The plain tensors move for the images there are: less traffic for 8 than 16.
                assert!(shape(8).winograd(direction, tile).1 < shape(16).winograd(direction, tile).1);
            }
        }
        // Backward-weight reduces over the tiles there are; the fused kernel tiles its images as
        // they are.
        assert_eq!(shape(8).winograd(weight, 4).0.k, 8 * 16);
        assert_eq!(shape(8).fused_winograd(forward).unwrap().0.m, 8 * 49);
    }

    #[test]
    fn a_transposed_convolution_is_the_backward_data_of_its_mirror() {
        let up = Layer::new(
            "up",
            LayerKind::ConvTranspose {
                out_channels: 64,
                kernel: vec![2, 2],
                stride: vec![2, 2],
                padding: vec![0, 0],
                output_padding: vec![0, 0],
                dilation: vec![1, 1],
                groups: 1,
                bias: false,
            },
            Shape::from([128, 28, 28]),
        )
        .unwrap();
        let KernelShape::Conv { shape, direction } = KernelShape::of_layer(&up, Pass::Forward, 4) else {
            panic!()
        };
        assert_eq!(direction, ConvDirection::BackwardData);
        assert_eq!((shape.in_channels, shape.out_channels), (64, 128));
        assert_eq!((shape.input, shape.output), ([56, 56, 1], [28, 28, 1]));
        // Its product does the layer's forward FLOPs.
        let gemm = shape.implicit_gemm(direction, 1);
        assert_eq!(gemm.flops(), up.cost.flops(Pass::Forward, 4));
    }

    #[test]
    fn linear_layers_and_attention_have_their_products() {
        let linear = Layer::new(
            "fc",
            LayerKind::Linear { out_features: 4096, bias: false },
            Shape::from([2048, 1024]),
        )
        .unwrap();
        assert_eq!(
            KernelShape::of_layer(&linear, Pass::BackwardWeight, 4),
            KernelShape::Gemm(
                GemmShape::new(4096, 1024, 8192)
                    .with_layout(GemmLayout { a: Major::Output, b: Major::Output })
            )
        );
        let attention = Layer::new(
            "attn",
            LayerKind::Attention {
                heads: 16,
                kv_heads: 16,
                causal: false,
                implementation: crate::layer::AttentionKernel::Standard,
                dropout: false,
                value_head_dim: None,
            },
            Shape::from([2048, 3 * 1024]),
        )
        .unwrap();
        let KernelShape::Attention(shape) = KernelShape::of_layer(&attention, Pass::Forward, 2) else {
            panic!()
        };
        assert_eq!(shape.products()[0], GemmShape { batch: 32, m: 2048, n: 2048, k: 64, layout: None });
    }
}
