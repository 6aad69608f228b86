//! Baidu DeepBench's training-kernel tables (GEMMs and convolutions with measured times) as
//! kernels the compute model prices and calibration fits.
//!
//! The tables are the CSV conversions described in `../shared/data/kernels/deepbench/PROVENANCE.md`:
//! `*-gemm.csv` (`source,M,N,K,a_transpose,b_transpose,time_ms,tflops`) and `*-conv.csv`
//! (`source,W,H,C,N,K,S,R,pad_w,pad_h,stride_w,stride_h,fwd_ms,bwd_inputs_ms,bwd_params_ms,P,Q,
//! total_ms,fwd_algorithm`). This module parses text; callers read the files.
//!
//! Two quirks of the source workbooks are handled here rather than by editing the data:
//! - Some sheets list the filter width under `R` and its height under `S` (the P100 sheet does,
//!   the V100 sheet does not), and print output sizes without rounding down (`78.5`). The
//!   filter's orientation is taken as the one whose output sizes, computed with PyTorch's
//!   `floor((in + 2 pad - kernel) / stride) + 1`, are nearest the table's `P, Q`.
//! - `N/A*` marks a time the source does not have (the backward-data time of a first layer,
//!   which training never computes): that direction is left out.

use crate::calibrate::Sample;
use crate::compute::KernelWork;
use crate::device::{Device, Dtype};
use crate::kernel_shape::{ConvDirection, ConvShape, GemmLayout, GemmShape, KernelShape};
use crate::layer::OpClass;

/// A table could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeepBenchError {
    /// The header lacks a column the reader needs.
    #[error("DeepBench table: no column `{column}` in the header")]
    MissingColumn {
        /// The column's name.
        column: &'static str,
    },
    /// A cell does not hold what its column needs.
    #[error("DeepBench table, line {line}: `{column}` is {value:?}, expected {expected}")]
    BadValue {
        /// 1-based line in the text.
        line: usize,
        /// The column.
        column: &'static str,
        /// The text found.
        value: String,
        /// What would be valid.
        expected: &'static str,
    },
    /// The text has no data rows.
    #[error("DeepBench table has no rows")]
    Empty,
    /// The text is not CSV (a quoted field not closed, a line that is not UTF-8).
    #[error("DeepBench table, line {line}: not CSV: {message}")]
    Csv {
        /// 1-based line in the text.
        line: usize,
        /// The reader's message.
        message: String,
    },
}

/// One measured matrix product.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmRow {
    /// The product (cuBLAS column-major: `C[m, n] = op(A)[m, k] op(B)[k, n]`), with the layout
    /// the table's `"N"`/`"T"` columns give ([`GemmLayout::blas`]).
    pub shape: GemmShape,
    /// Measured seconds.
    pub seconds: f64,
}

/// One measured convolution, with a time per direction where the table has one.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvRow {
    /// The convolution (2-D: the third spatial axis is 1).
    pub shape: ConvShape,
    /// Measured seconds of the forward, backward-data and backward-weight kernels.
    pub seconds: [Option<f64>; 3],
    /// The forward algorithm cuDNN chose, as the table names it.
    pub forward_algorithm: String,
}

/// The three directions in the order of [`ConvRow::seconds`].
pub const DIRECTIONS: [ConvDirection; 3] =
    [ConvDirection::Forward, ConvDirection::BackwardData, ConvDirection::BackwardWeight];

/// A CSV table with a header, read by the `csv` crate (cells trimmed, blank lines skipped).
struct Table {
    header: Vec<String>,
    rows: Vec<(usize, Vec<String>)>,
}

impl Table {
    fn parse(text: &str) -> Result<Table, DeepBenchError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let line = |position: Option<&csv::Position>| {
            position.map_or(0, |p| usize::try_from(p.line()).unwrap_or(usize::MAX))
        };
        let mut records = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|error| DeepBenchError::Csv {
                line: line(error.position()),
                message: error.to_string(),
            })?;
            if record.iter().all(str::is_empty) {
                continue;
            }
            records.push((line(record.position()), record.iter().map(str::to_string).collect::<Vec<_>>()));
        }
        let mut records = records.into_iter();
        let header = records.next().map(|(_, header)| header).unwrap_or_default();
        let rows: Vec<_> = records.collect();
        if rows.is_empty() {
            return Err(DeepBenchError::Empty);
        }
        Ok(Table { header, rows })
    }

    fn column(&self, column: &'static str) -> Result<usize, DeepBenchError> {
        self.header.iter().position(|name| *name == column).ok_or(DeepBenchError::MissingColumn { column })
    }
}

/// A cell of row `line`.
struct Cells<'r> {
    line: usize,
    cells: &'r [String],
    table: &'r Table,
}

impl Cells<'_> {
    fn text(&self, column: &'static str) -> Result<&str, DeepBenchError> {
        let index = self.table.column(column)?;
        Ok(self.cells.get(index).map_or("", String::as_str))
    }

    fn bad(&self, column: &'static str, expected: &'static str) -> DeepBenchError {
        let value = self.text(column).unwrap_or_default().to_string();
        DeepBenchError::BadValue { line: self.line, column, value, expected }
    }

    fn count(&self, column: &'static str) -> Result<u64, DeepBenchError> {
        self.text(column)?.parse().map_err(|_| self.bad(column, "a whole number"))
    }

    fn number(&self, column: &'static str) -> Result<f64, DeepBenchError> {
        self.text(column)?
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite())
            .ok_or_else(|| self.bad(column, "a number"))
    }

    /// Milliseconds as seconds; `None` for `N/A*` or an empty cell.
    fn time(&self, column: &'static str) -> Result<Option<f64>, DeepBenchError> {
        let text = self.text(column)?;
        if text.is_empty() || text.starts_with("N/A") {
            return Ok(None);
        }
        match text.parse::<f64>() {
            Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(ms * 1e-3)),
            _ => Err(self.bad(column, "a positive time in ms or N/A*")),
        }
    }

    fn transposed(&self, column: &'static str) -> Result<bool, DeepBenchError> {
        match self.text(column)? {
            "N" => Ok(false),
            "T" => Ok(true),
            _ => Err(self.bad(column, "N or T")),
        }
    }
}

fn rows(table: &Table) -> impl Iterator<Item = Cells<'_>> {
    table.rows.iter().map(move |(line, cells)| Cells { line: *line, cells, table })
}

/// Reads a `*-gemm.csv` table.
pub fn parse_gemms(text: &str) -> Result<Vec<GemmRow>, DeepBenchError> {
    let table = Table::parse(text)?;
    rows(&table)
        .map(|row| {
            let shape = GemmShape::new(row.count("M")?, row.count("N")?, row.count("K")?);
            let seconds = row.time("time_ms")?.ok_or_else(|| row.bad("time_ms", "a measured time"))?;
            let transposed = [row.transposed("a_transpose")?, row.transposed("b_transpose")?];
            let shape = shape.with_layout(GemmLayout::blas(transposed[0], transposed[1]));
            Ok(GemmRow { shape, seconds })
        })
        .collect()
}

/// `floor((input + 2 pad - kernel) / stride) + 1`, or `None` when the kernel does not fit.
fn output_size(input: u64, pad: u64, kernel: u64, stride: u64) -> Option<u64> {
    (input + 2 * pad).checked_sub(kernel).map(|span| span / stride.max(1) + 1)
}

/// Reads a `*-conv.csv` table.
pub fn parse_convs(text: &str) -> Result<Vec<ConvRow>, DeepBenchError> {
    let table = Table::parse(text)?;
    rows(&table)
        .map(|row| {
            let (width, height) = (row.count("W")?, row.count("H")?);
            let (filter_s, filter_r) = (row.count("S")?, row.count("R")?);
            let (pad_w, pad_h) = (row.count("pad_w")?, row.count("pad_h")?);
            let (stride_w, stride_h) = (row.count("stride_w")?, row.count("stride_h")?);
            let (listed_p, listed_q) = (row.number("P")?, row.number("Q")?);
            // The orientation whose (unordered) output sizes are nearest the listed ones.
            let mut best: Option<(f64, [u64; 2], [u64; 2])> = None;
            for (kernel_w, kernel_h) in [(filter_s, filter_r), (filter_r, filter_s)] {
                let (Some(out_w), Some(out_h)) = (
                    output_size(width, pad_w, kernel_w, stride_w),
                    output_size(height, pad_h, kernel_h, stride_h),
                ) else {
                    continue;
                };
                let (w, h) = (out_w as f64, out_h as f64);
                let distance = ((listed_p - h).abs() + (listed_q - w).abs())
                    .min((listed_p - w).abs() + (listed_q - h).abs());
                if best.is_none_or(|(d, _, _)| distance < d) {
                    best = Some((distance, [kernel_h, kernel_w], [out_h, out_w]));
                }
            }
            let Some((_, kernel, output)) = best else {
                return Err(row.bad("S", "a filter that fits the padded input"));
            };
            let shape = ConvShape {
                batch: row.count("N")?,
                in_channels: row.count("C")?,
                out_channels: row.count("K")?,
                groups: 1,
                input: [height, width, 1],
                output: [output[0], output[1], 1],
                kernel: [kernel[0], kernel[1], 1],
                stride: [stride_h, stride_w, 1],
            };
            let seconds = [row.time("fwd_ms")?, row.time("bwd_inputs_ms")?, row.time("bwd_params_ms")?];
            let forward_algorithm = row.text("fwd_algorithm").unwrap_or_default().to_string();
            Ok(ConvRow { shape, seconds, forward_algorithm })
        })
        .collect()
}

impl GemmRow {
    /// The kernel's work in `dtype` (inputs and output stored as `dtype`).
    pub fn work(&self, dtype: Dtype) -> KernelWork {
        KernelWork::gemm(self.shape, dtype)
    }
}

impl ConvRow {
    /// The work of `direction` in `dtype`: the implicit GEMM's FLOPs (forward FLOPs for every
    /// direction, as frameworks count them) and one pass over input, weights and output.
    pub fn work(&self, direction: ConvDirection, dtype: Dtype) -> KernelWork {
        let s = &self.shape;
        let flops = s.implicit_gemm(ConvDirection::Forward, 1).flops();
        let spatial = |sizes: [u64; 3]| sizes.iter().product::<u64>();
        let elements = s.batch * s.in_channels * spatial(s.input)
            + s.out_channels * s.in_channels * spatial(s.kernel)
            + s.batch * s.out_channels * spatial(s.output);
        KernelWork {
            shape: KernelShape::Conv { shape: *s, direction },
            ..KernelWork::flat(OpClass::Gemm, dtype, flops, elements as f64 * dtype.bytes() as f64)
        }
    }
}

/// Channel multiple DeepBench pads convolutions to when it runs them on Tensor Cores: its
/// `conv_bench.cu` (github.com/baidu-research/DeepBench, `code/nvidia`, built with
/// `USE_TENSOR_CORES` for cuDNN 7, as the V100 half-precision results were: every one of their
/// forward algorithms is the Tensor Core `IMPLICIT_PRECOMP_GEMM`) rounds the input channels `C`
/// and the filters `K` of a half-precision training convolution up to multiples of 8 before
/// timing it ("Tensor cores need channels to be a multiple of 8"), in NHWC. Its fp32 runs and
/// its cuDNN 6 (P100) runs time the layer as listed.
pub const TENSOR_CORE_CHANNEL_PADDING: u64 = 8;

impl ConvRow {
    /// The convolution DeepBench timed for this row in `dtype` on `device`: the listed one, or,
    /// when `dtype` runs on the device's matrix units, with its channels padded to
    /// [`TENSOR_CORE_CHANNEL_PADDING`].
    pub fn as_timed(&self, device: &Device, dtype: Dtype) -> ConvRow {
        let mut row = self.clone();
        if device.execution.as_ref().is_some_and(|execution| execution.on_matrix_units(dtype)) {
            let pad =
                |channels: u64| channels.div_ceil(TENSOR_CORE_CHANNEL_PADDING) * TENSOR_CORE_CHANNEL_PADDING;
            row.shape.in_channels = pad(row.shape.in_channels);
            row.shape.out_channels = pad(row.shape.out_channels);
        }
        row
    }
}

/// Calibration samples of a GEMM table and a convolution table measured in `dtype` on
/// `device`: one per product and one per convolution direction with a time, each convolution
/// as DeepBench timed it there ([`ConvRow::as_timed`]). Samples of the same shape (and
/// direction) share a group, so cross-validation holds whole shapes out.
pub fn samples(device: &Device, gemms: &[GemmRow], convs: &[ConvRow], dtype: Dtype) -> Vec<Sample> {
    let mut samples = Vec::new();
    for row in gemms {
        let GemmShape { m, n, k, .. } = row.shape;
        let group = group_of(&[1, m, n, k]);
        samples.push(Sample {
            work: row.work(dtype),
            after: Vec::new(),
            kernels: 1,
            measured_s: row.seconds,
            communication: 0.0,
            group,
        });
    }
    for row in convs {
        let row = row.as_timed(device, dtype);
        for (index, direction) in DIRECTIONS.into_iter().enumerate() {
            let Some(seconds) = row.seconds[index] else { continue };
            let s = &row.shape;
            let mut key = vec![2 + index as u64, s.batch, s.in_channels, s.out_channels];
            key.extend(s.input.iter().chain(&s.kernel).chain(&s.stride));
            samples.push(Sample {
                work: row.work(direction, dtype),
                after: Vec::new(),
                kernels: 1,
                measured_s: seconds,
                communication: 0.0,
                group: group_of(&key),
            });
        }
    }
    samples
}

/// A stable hash of a shape key (FNV-1a), for cross-validation groups.
fn group_of(key: &[u64]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, value| {
        value.to_le_bytes().iter().fold(hash, |h, byte| (h ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEMMS: &str = "source,M,N,K,a_transpose,b_transpose,time_ms,tflops\nDeepSpeech,1760,16,1760,N,N,0.038,2.6\n,35,8457,4096,T,N,0.121,20.0\n";
    const CONVS: &str = "source,W,H,C,N,K,S,R,pad_w,pad_h,stride_w,stride_h,fwd_ms,bwd_inputs_ms,bwd_params_ms,P,Q,total_ms,fwd_algorithm\n\
        DeepSpeech,700,161,1,4,32,20,5,0,0,2,2,0.078,N/A*,0.127,341,79,0.205,IMPLICIT_GEMM\n\
        ,700,161,1,4,32,5,20,0,0,2,2,0.142,0.482,0.301,78.5,340.5,0.925,IMPLICIT_PRECOMP_GEMM\n";

    #[test]
    fn gemm_rows_parse() {
        let rows = parse_gemms(GEMMS).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].shape, GemmShape::new(35, 8457, 4096).with_layout(GemmLayout::blas(true, false)));
        assert_eq!(rows[1].shape.layout.map(|l| l.blas_flags()), Some([true, false]));
        assert!((rows[0].seconds - 38e-6).abs() < 1e-12);
    }

    #[test]
    fn both_filter_orientations_give_the_same_convolution() {
        let rows = parse_convs(CONVS).unwrap();
        // The V100 sheet's 20-wide filter over the 700-wide axis, and the P100 sheet's listing
        // of the same layer with R and S swapped and unrounded output sizes.
        assert_eq!(rows[0].shape, rows[1].shape);
        assert_eq!(rows[0].shape.output, [79, 341, 1]);
        assert_eq!(rows[0].shape.kernel, [5, 20, 1]);
        assert_eq!(rows[0].seconds[1], None);
        let v100 = crate::device::DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
        assert_eq!(samples(v100, &[], &rows, Dtype::Fp32).len(), 5);
        // Half precision on Tensor Cores: DeepBench timed the layer with 8 input channels.
        assert_eq!(rows[0].as_timed(v100, Dtype::Fp16).shape.in_channels, 8);
        assert_eq!(rows[0].as_timed(v100, Dtype::Fp32).shape, rows[0].shape);
        let p100 = crate::device::DeviceCatalog::builtin().get("p100-pcie-16gb").unwrap();
        assert_eq!(rows[0].as_timed(p100, Dtype::Fp16).shape, rows[0].shape);
    }

    #[test]
    fn bad_tables_name_line_and_column() {
        let error = parse_gemms(&GEMMS.replace("1760,16", "1760,x")).unwrap_err().to_string();
        assert!(error.contains("line 2") && error.contains("`N`"), "{error}");
        let error = parse_gemms("M,N\n1,2\n").unwrap_err().to_string();
        assert!(error.contains("`K`"), "{error}");
        assert_eq!(parse_convs("W,H\n"), Err(DeepBenchError::Empty));
        let error = parse_convs(&CONVS.replace("0.078", "-1")).unwrap_err().to_string();
        assert!(error.contains("fwd_ms"), "{error}");
    }
}
