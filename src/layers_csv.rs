//! `parasim run --csv` and `--buckets-csv`: the run's per-layer breakdown (every kernel of
//! every layer, as one rank of each pipeline stage runs it) and its gradient buckets, as CSV
//! (written by [`scenario::csv_text::line`]).

use std::path::Path;

use anyhow::Context;
use scenario::Scenario;
use scenario::csv_text::line;
use strategies::KernelTable;

/// The columns of the per-layer CSV: each kernel's FLOPs, time and modelled memory traffic
/// (`bytes`, per run), and on every row the device's peak rate in the run's compute dtype and
/// its memory bandwidth, the two roofs `parasim plot roofline` draws.
pub const LAYER_COLUMNS: &str = "stage,chunk,layer,name,kind,pass,runs_per_iteration,flops,kernel_time_s,flops_per_iteration,kernel_time_per_iteration_s,bytes,peak_flops_per_s,memory_bandwidth_bytes_per_s";
/// The columns of the bucket CSV.
pub const BUCKET_COLUMNS: &str = "stage,chunk,bucket,collective,expert,bytes,layers,first_layer,last_layer";

/// The per-layer CSV of `table`.
pub fn layers(table: &KernelTable) -> String {
    let mut out = format!("{LAYER_COLUMNS}\n");
    for row in &table.kernels {
        let time = row.time.as_secs_f64();
        let runs = f64::from(row.runs);
        out.push_str(&line(&[
            row.stage.to_string(),
            row.chunk.to_string(),
            row.layer.map_or(String::new(), |l| l.to_string()),
            row.name.clone(),
            row.kind.clone(),
            row.pass.name().to_string(),
            row.runs.to_string(),
            row.flops.to_string(),
            time.to_string(),
            (row.flops * runs).to_string(),
            (time * runs).to_string(),
            row.bytes.to_string(),
            table.peak_flops_per_s.to_string(),
            table.memory_bandwidth_bytes_per_s.to_string(),
        ]));
    }
    out
}

/// The bucket CSV of `table`; `names` are the model's layer names.
pub fn buckets(table: &KernelTable, names: &[String]) -> String {
    let name = |index: Option<&usize>| index.and_then(|&i| names.get(i)).cloned().unwrap_or_default();
    let mut out = format!("{BUCKET_COLUMNS}\n");
    for row in &table.buckets {
        out.push_str(&line(&[
            row.stage.to_string(),
            row.chunk.to_string(),
            row.index.to_string(),
            row.collective.to_string(),
            row.expert.to_string(),
            row.bytes.0.to_string(),
            row.layers.len().to_string(),
            name(row.layers.first()),
            name(row.layers.last()),
        ]));
    }
    out
}

/// Writes the per-layer CSV to `layers_path` and the bucket CSV to `buckets_path` (either may
/// be absent).
pub fn write(
    scenario: &Scenario,
    layers_path: Option<&Path>,
    buckets_path: Option<&Path>,
) -> anyhow::Result<()> {
    let table = scenario.strategy().kernel_table().context("building the per-layer table")?;
    if let Some(path) = layers_path {
        traces::atomic::write(path, layers(&table)).context("writing the per-layer CSV")?;
    }
    if let Some(path) = buckets_path {
        let names: Vec<String> = scenario.model.layers.iter().map(|l| l.name.clone()).collect();
        traces::atomic::write(path, buckets(&table, &names)).context("writing the bucket CSV")?;
    }
    Ok(())
}
