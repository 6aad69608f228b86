//! The compute model against Baidu DeepBench's measured training kernels on V100 and P100
//! (`../shared/data/kernels/deepbench/`, read from there, never copied; see its PROVENANCE.md).
//!
//! Accuracy of one kernel is `max(0, 1 - |predicted / measured - 1|)`; a table's accuracy is the
//! mean over its kernels (GEMMs, and each convolution direction with a measured time). The
//! bounds below are the values measured when they were recorded, rounded down; they only
//! ratchet up. `cargo test -p workloads --test it deepbench -- --nocapture` prints the table.

use std::path::PathBuf;

use workloads::calibrate::{Sample, predict};
use workloads::deepbench::{self, ConvRow, GemmRow};
use workloads::{ComputeModel, Device, DeviceCatalog, Dtype};

fn table(name: &str) -> String {
    let path =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/kernels/deepbench")).join(name);
    fs_err::read_to_string(&path).unwrap_or_else(|error| {
        panic!("missing DeepBench table {} (see PROVENANCE.md there): {error}", path.display())
    })
}

/// The default model as DeepBench measures: every convolution algorithm timed and the fastest
/// kept (Winograd on the vector units included).
pub fn deepbench_defaults() -> ComputeModel {
    ComputeModel { winograd_convolutions: true, ..ComputeModel::default() }
}

/// GEMM and convolution rows of one device and precision (`"v100"`, `"fp32"`).
pub fn tables(device: &str, precision: &str) -> (Vec<GemmRow>, Vec<ConvRow>) {
    let gemms = deepbench::parse_gemms(&table(&format!("{device}-{precision}-gemm.csv"))).unwrap();
    let convs = deepbench::parse_convs(&table(&format!("{device}-{precision}-conv.csv"))).unwrap();
    (gemms, convs)
}

/// Mean accuracy of `samples` priced by `model` on `device`.
pub fn accuracy(model: &ComputeModel, device: &Device, samples: &[Sample]) -> f64 {
    let sum: f64 = samples
        .iter()
        .map(|sample| {
            let predicted = predict(model, device, sample).unwrap();
            (1.0 - (predicted / sample.measured_s - 1.0).abs()).max(0.0)
        })
        .sum();
    sum / samples.len() as f64
}

/// Mean accuracy of the GEMMs and of the convolutions of one table pair.
pub fn measure(model: &ComputeModel, device: &str, precision: &str, dtype: Dtype) -> (f64, f64) {
    let (gemms, convs) = tables(device.split('-').next().unwrap(), precision);
    let device = DeviceCatalog::builtin().get(device).unwrap();
    let gemm = accuracy(model, device, &deepbench::samples(device, &gemms, &[], dtype));
    let conv = accuracy(model, device, &deepbench::samples(device, &[], &convs, dtype));
    (gemm, conv)
}

/// The tables, with the device and dtype they are priced in.
pub const CASES: [(&str, &str, Dtype); 4] = [
    ("v100-sxm2-16gb", "fp32", Dtype::Fp32),
    ("v100-sxm2-16gb", "fp16-mixed", Dtype::Fp16),
    ("p100-pcie-16gb", "fp32", Dtype::Fp32),
    ("p100-pcie-16gb", "fp16-mixed", Dtype::Fp16),
];

#[test]
fn the_tables_have_every_kernel() {
    for (device, precision, _) in CASES {
        let (gemms, convs) = tables(device.split('-').next().unwrap(), precision);
        assert_eq!((gemms.len(), convs.len()), (160, 94), "{device} {precision}");
    }
}

#[test]
fn default_model_accuracy_on_deepbench() {
    let model = deepbench_defaults();
    // (gemm, conv) lower bounds with the defaults, per case of CASES.
    let bounds = [(0.90, 0.818), (0.849, 0.858), (0.79, 0.75), (0.80, 0.593)];
    for ((device, precision, dtype), (gemm_bound, conv_bound)) in CASES.into_iter().zip(bounds) {
        let (gemm, conv) = measure(&model, device, precision, dtype);
        // The same kernels without their shapes and with one GEMM ceiling: the FLOPs-only model
        // parasim had before.
        let (gemms, convs) = tables(device.split('-').next().unwrap(), precision);
        let before = ComputeModel { vector_gemm_efficiency: model.gemm_efficiency, ..model.clone() };
        let catalog = DeviceCatalog::builtin().get(device).unwrap();
        let flat = |mut samples: Vec<Sample>| {
            samples.iter_mut().for_each(|s| s.work.shape = workloads::KernelShape::Unknown);
            accuracy(&before, catalog, &samples)
        };
        let (flat_gemm, flat_conv) = (
            flat(deepbench::samples(catalog, &gemms, &[], dtype)),
            flat(deepbench::samples(catalog, &[], &convs, dtype)),
        );
        println!(
            "defaults, {device} {precision}: GEMMs {:.1}% (FLOPs only: {:.1}%), convolutions {:.1}% (FLOPs only: {:.1}%)",
            gemm * 100.0,
            flat_gemm * 100.0,
            conv * 100.0,
            flat_conv * 100.0
        );
        assert!(gemm >= gemm_bound && conv >= conv_bound, "{device} {precision}: {gemm} {conv}");
    }
}

/// SplitMix64, to split shapes into two halves independently of their order.
fn half_of(group: u64) -> u64 {
    let mut x = group.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % 2
}

/// A V100 profile fitted to half of the V100 shapes (fp32 and fp16 together: one profile per
/// device type), checked on the other half; then the same profile on P100 fp32, only the
/// device changed.
#[test]
fn a_profile_fitted_on_half_the_shapes_predicts_the_other_half() {
    let v100 = DeviceCatalog::builtin().get("v100-sxm2-16gb").unwrap();
    let mut training = Vec::new();
    let mut held_out = Vec::new();
    for (device, precision, dtype) in &CASES[..2] {
        let (gemms, convs) = tables(device.split('-').next().unwrap(), precision);
        for sample in deepbench::samples(v100, &gemms, &convs, *dtype) {
            if half_of(sample.group) == 0 {
                training.push(sample)
            } else {
                held_out.push((*precision, sample))
            }
        }
    }
    // The defaults on the training half: what a constant chosen without fitting (the Tensor
    // Core backward-data helper count, `compute::conv_helper_kernels`) is judged on.
    for precision in ["fp32", "fp16-mixed"] {
        let (device, _, dtype) = CASES.iter().find(|case| case.1 == precision).unwrap();
        let (_, convs) = tables(device.split('-').next().unwrap(), precision);
        let half: Vec<Sample> = deepbench::samples(v100, &[], &convs, *dtype)
            .into_iter()
            .filter(|s| half_of(s.group) == 0)
            .collect();
        println!(
            "training-half V100 {precision}: convolutions with the defaults {:.1}% ({} kernels)",
            accuracy(&deepbench_defaults(), v100, &half) * 100.0,
            half.len()
        );
    }
    let fit = workloads::calibrate::fit_staged(v100, &training, &deepbench_defaults(), &[]).unwrap();
    println!("fitted on {} V100 kernels: {:?}", training.len(), fit.model);
    // (precision, gemm bound, conv bound) on the held-out half. cuDNN's FFT algorithms (fp32
    // benchmark mode only) move the convolution factors fp32 and fp16 share: fp32 73.4% ->
    // 75.2%, fp16 80.7% -> 80.5% (a Huber loss that kept fp16 at 81.3% re-fitted the P100
    // profile past the suite's transfer rule, so it was taken out). cuDNN's helper kernels and
    // the fused Winograd: 77.6% and 82.2%, P100 fp32 76.5% -> 78.7%. The zeroing pass of
    // strided 1x1 backward-data: fp32 79.3%, P100 fp32 79.1%, and fp16 down to 81.2% (its
    // floor from 0.821 to 0.81): the shared fitted backward-data factor went from 0.91 to 0.97
    // once the strided fp32 layers no longer pulled it down, which had also slowed the fp16
    // backward-data passes the defaults price too fast (docs/compute-model.md, "DeepBench").
    // The filling split of 2-D SIMT backward-weight: fp32 82.3%, P100 fp32 78.9%, fp16 80.8%
    // (the fitted backward-weight factor 0.90 -> 0.87). Tensor Core backward-data writing its
    // unreached positions' zeros itself (no zeroing pass): fp32 82.2%, fp16 82.2%, P100 79.0%
    // (backward-data factor 0.97 -> 0.96).
    // The GEMM layout (`k-major-thin-gemm-efficiency`, fitted 0.80): GEMMs 92.9% -> 93.4%,
    // 86.3% -> 86.7%, and through the GEMM curve convolutions 82.2% -> 82.5% and 82.5%.
    // Winograd through memory in groups of 16 images (cuDNN's layout): convolutions 82.5% ->
    // 82.7% and 82.6%, P100 fp32 79.0% -> 79.4%.
    let bounds = [("fp32", 0.93, 0.824), ("fp16-mixed", 0.865, 0.824)];
    for (precision, gemm_bound, conv_bound) in bounds {
        let (gemms, convs): (Vec<_>, Vec<_>) = held_out
            .iter()
            .filter(|(p, _)| *p == precision)
            .map(|(_, s)| s.clone())
            .partition(|s| matches!(s.work.shape, workloads::KernelShape::Gemm(_)));
        let (gemm, conv) = (accuracy(&fit.model, v100, &gemms), accuracy(&fit.model, v100, &convs));
        let default = deepbench_defaults();
        println!(
            "held-out V100 {precision}: GEMMs {:.1}% ({} kernels; defaults {:.1}%), convolutions {:.1}% ({}; defaults {:.1}%)",
            gemm * 100.0,
            gemms.len(),
            accuracy(&default, v100, &gemms) * 100.0,
            conv * 100.0,
            convs.len(),
            accuracy(&default, v100, &convs) * 100.0,
        );
        assert!(gemm >= gemm_bound && conv >= conv_bound, "{precision}: {gemm} {conv}");
    }
    let (gemm, conv) = measure(&fit.model, "p100-pcie-16gb", "fp32", Dtype::Fp32);
    println!("V100 profile on P100 fp32: GEMMs {:.1}%, convolutions {:.1}%", gemm * 100.0, conv * 100.0);
    assert!(gemm >= 0.77 && conv >= 0.789, "{gemm} {conv}");
}

/// Prints every kernel's prediction (for analysis): `cargo test -p workloads --test it
/// deepbench::dump -- --ignored --nocapture`.
#[test]
#[ignore]
fn dump() {
    let model = deepbench_defaults();
    for (device, precision, dtype) in CASES {
        let (gemms, convs) = tables(device.split('-').next().unwrap(), precision);
        let catalog = DeviceCatalog::builtin().get(device).unwrap();
        for (row, sample) in gemms.iter().zip(deepbench::samples(catalog, &gemms, &[], dtype)) {
            let p = predict(&model, catalog, &sample).unwrap();
            let s = row.shape;
            let flags = s.layout.map_or([false, false], |l| l.blas_flags());
            println!(
                "DUMP {device} {precision} gemm {} {} {} {}{} {:.3} {:.3}",
                s.m,
                s.n,
                s.k,
                if flags[0] { "T" } else { "N" },
                if flags[1] { "T" } else { "N" },
                sample.measured_s * 1e6,
                p * 1e6
            );
        }
        for row in &convs {
            let row = row.as_timed(catalog, dtype);
            for (i, direction) in deepbench::DIRECTIONS.into_iter().enumerate() {
                let Some(measured) = row.seconds[i] else { continue };
                let sample = Sample {
                    work: row.work(direction, dtype),
                    after: Vec::new(),
                    kernels: 1,
                    measured_s: measured,
                    communication: 0.0,
                    group: 0,
                };
                let p = predict(&model, catalog, &sample).unwrap();
                let s = row.shape;
                println!(
                    "DUMP {device} {precision} conv{i} N{} C{} {}x{} K{} f{}x{} s{} {} {:.3} {:.3}",
                    s.batch,
                    s.in_channels,
                    s.input[0],
                    s.input[1],
                    s.out_channels,
                    s.kernel[0],
                    s.kernel[1],
                    s.stride[0],
                    row.forward_algorithm,
                    measured * 1e6,
                    p * 1e6
                );
            }
        }
    }
}

/// Profiles transfer: a shipped profile fitted to other workloads (the V100 one to DLRM traces)
/// prices DeepBench's kernels no more than 2 points worse than the defaults, per table and
/// class (issue 12's rule).
#[test]
fn shipped_profiles_do_not_make_deepbench_worse_than_the_defaults() {
    let default = deepbench_defaults();
    // Issue 12's validation tables (V100 fp32 and fp16, P100 fp32); P100 fp16-mixed, cuDNN 6's
    // half-precision kernels, is reported by the other tests, not held to the rule.
    for (device, precision, dtype) in &CASES[..3] {
        let (device, precision, dtype) = (*device, *precision, *dtype);
        let Ok(profile) = workloads::profile::Profile::builtin(device) else { continue };
        // A profile fitted to this very table is not a transfer (its fit is reported by
        // `parasim calibrate`).
        let table = format!("{}-{precision}-gemm.csv", device.split('-').next().unwrap());
        if profile.calibration.as_ref().is_some_and(|record| record.traces.contains(&table)) {
            continue;
        }
        let model = ComputeModel { winograd_convolutions: true, ..profile.compute.clone() };
        let (gemm, conv) = measure(&model, device, precision, dtype);
        let (default_gemm, default_conv) = measure(&default, device, precision, dtype);
        println!(
            "profile {device} on {precision}: GEMMs {:.1}% (defaults {:.1}%), convolutions {:.1}% (defaults {:.1}%)",
            gemm * 100.0,
            default_gemm * 100.0,
            conv * 100.0,
            default_conv * 100.0
        );
        assert!(gemm >= default_gemm - 0.02 && conv >= default_conv - 0.02, "{device} {precision}");
    }
}
