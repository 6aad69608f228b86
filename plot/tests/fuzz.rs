//! Mutation fuzzing of the CSV reader and every chart kind (issue 38, fuzzing that runs on
//! stable): a table any chart can draw, with random characters replaced, deleted, inserted or
//! duplicated, gives a chart or an error naming the file, never a panic. `cargo test` runs 128
//! cases; `FUZZ_SECONDS=N` runs cases for N seconds instead (docs/fuzzing.md).

use fuzzing::Campaign;
use plot::table::Table;
use plot::{Format, Size, bars, heatmap, line, roofline, scatter};
use proptest::prelude::*;

const SEED: &str = "status,axis.gpus,axis.model,iteration_time_s,mfu,breakdown.compute_s,breakdown.exposed_communication_s,family,measured,simulated,unit,pass,flops,bytes,kernel_time_s,peak_flops_per_s,memory_bandwidth_bytes_per_s\n\
ok,8,resnet,0.25,0.41,0.2,0.05,nccl,1.0,1.1,s,forward,1e9,1e6,0.001,312e12,2e12\n\
ok,16,resnet,0.26,0.40,0.2,0.06,nccl,2.0,1.9,s,backward-data,2e9,1e7,0.002,312e12,2e12\n\
ok,8,gpt,1.5,0.52,1.2,0.3,megatron,3.0,3.2,s,forward,0,1e6,0.001,312e12,2e12\n\
failed,16,gpt,,,,,megatron,,,,,,,,,\n\
ok,16,gpt,1.6,0.50,1.2,0.4,megatron,4.0,3.7,s,optimizer,1e8,5e8,0.0003,312e12,2e12\n";

/// Every chart of `text`: a chart or an error, and an error names the file.
fn every_chart(text: &str) -> Result<(), TestCaseError> {
    let table = match Table::parse(text, "fuzz.csv") {
        Ok(table) => table,
        Err(error) => {
            prop_assert!(error.to_string().contains("fuzz.csv"), "{}", error);
            return Ok(());
        }
    };
    let size = Size { width: 320, height: 240 };
    let line = line::Options {
        x: "axis.gpus".into(),
        y: "iteration_time_s".into(),
        series: vec!["axis.model".into()],
        logx: Some(2),
        ..Default::default()
    };
    let heat =
        heatmap::Options { x: "axis.gpus".into(), y: "axis.model".into(), z: "mfu".into(), title: None };
    let bars = bars::Options { fraction: true, ..Default::default() };
    let charts = [
        line::LineChart::from_table(&table, &line).map(plot::Chart::Line),
        heatmap::Heatmap::from_table(&table, &heat).map(plot::Chart::Heatmap),
        bars::BarChart::from_table(&table, &bars).map(plot::Chart::Bars),
        scatter::Scatter::from_table(&table, None).map(plot::Chart::Scatter),
        roofline::Roofline::from_table(&table, &roofline::Options::default()).map(plot::Chart::Roofline),
    ];
    for chart in charts {
        match chart {
            Ok(chart) => {
                let _ = chart.render(Format::Svg, size);
            }
            Err(error) => prop_assert!(error.to_string().contains("fuzz.csv"), "{}", error),
        }
    }
    Ok(())
}

/// Runs the property for `FUZZ_SECONDS` seconds with the workspace's mutation engine and
/// campaign runner (the `fuzzing` crate: no panic, no hang, no runaway allocation), or 128
/// cases when it is unset. Seeds: the table above and the hostile catalog's CSV files.
#[test]
fn plot_tables_never_panic() {
    let mut seeds = vec![SEED.to_string()];
    seeds.extend(fuzzing::hostile_texts("csv"));
    Campaign::from_env("plot_tables_never_panic")
        .run(fuzzing::mutated_text(seeds), |text| every_chart(&text));
}
