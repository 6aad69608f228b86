use super::output::{Format, Header, Kind, Shard, encode_row, merge, read_existing};
use super::*;

const BASE: &str = r#"
[base.cluster]
nodes = 2
device = "a100-sxm4-80gb"
[base.workload]
model = "resnet18"
batch-per-device = 8
"#;

fn sweep(rest: &str) -> Result<Sweep, SweepError> {
    Sweep::parse(&format!("{BASE}{rest}"), Path::new("sweeps/demo.toml"))
}

fn value_of(configuration: &Configuration, sweep: &Sweep, key: &str) -> serde_json::Value {
    let i = sweep.value_columns().iter().position(|c| c == key).unwrap();
    configuration.values[i].clone()
}

#[test]
fn axes_expand_in_file_order_last_axis_fastest() {
    let sweep = sweep(
        "[axes]\n\"workload.batch-per-device\" = { from = 2, to = 8, factor = 2 }\n\"cluster.nodes\" = [1, 2]\n\"cluster.network.link-bandwidth\" = [\"100 Gb/s\", \"200 Gb/s\"]\n",
    )
    .unwrap();
    assert_eq!(sweep.count(), 3 * 2 * 2);
    assert_eq!(
        sweep.value_columns(),
        ["workload.batch-per-device", "cluster.nodes", "cluster.network.link-bandwidth"]
    );
    let rows: Vec<Vec<serde_json::Value>> =
        (0..sweep.count()).map(|i| sweep.configuration(i).values).collect();
    assert_eq!(rows[0], [serde_json::json!(2), serde_json::json!(1), serde_json::json!("100 Gb/s")]);
    assert_eq!(rows[1], [serde_json::json!(2), serde_json::json!(1), serde_json::json!("200 Gb/s")]);
    assert_eq!(rows[2], [serde_json::json!(2), serde_json::json!(2), serde_json::json!("100 Gb/s")]);
    assert_eq!(rows[11], [serde_json::json!(8), serde_json::json!(2), serde_json::json!("200 Gb/s")]);
    let table = sweep.configuration(11).prepared.unwrap();
    assert_eq!(table["cluster"]["nodes"].as_integer(), Some(2));
    assert_eq!(table["cluster"]["device"].as_str(), Some("a100-sxm4-80gb"));
}

#[test]
fn ranges_by_step_and_factor() {
    assert_eq!(
        axis_values(&toml::Value::Table(toml::from_str("from = 1\nto = 7\nstep = 3").unwrap())).unwrap(),
        [1, 4, 7].map(toml::Value::Integer)
    );
    let floats =
        axis_values(&toml::Value::Table(toml::from_str("from = 0.5\nto = 1.0\nstep = 0.1").unwrap()))
            .unwrap();
    assert_eq!(floats.len(), 6);
    assert_eq!(
        axis_values(&toml::Value::Table(toml::from_str("from = 1\nto = 100\nfactor = 10").unwrap())).unwrap(),
        [1, 10, 100].map(toml::Value::Integer)
    );
}

#[test]
fn zipped_axes_advance_together() {
    let sweep = sweep(
        "[axes]\n\"cluster.nodes\" = [1, 2]\n[zip]\n\"parallelism.tensor\" = [1, 2, 8]\n\"parallelism.pipeline\" = [8, 4, 1]\n",
    )
    .unwrap();
    assert_eq!(sweep.count(), 6);
    let pairs: Vec<(serde_json::Value, serde_json::Value)> = (0..3)
        .map(|i| {
            let c = sweep.configuration(i);
            (value_of(&c, &sweep, "parallelism.tensor"), value_of(&c, &sweep, "parallelism.pipeline"))
        })
        .collect();
    assert_eq!(pairs, [(1.into(), 8.into()), (2.into(), 4.into()), (8.into(), 1.into())]);
    let error =
        super::tests::sweep("[zip]\n\"parallelism.tensor\" = [1, 2]\n\"parallelism.pipeline\" = [8, 4, 1]\n")
            .unwrap_err()
            .to_string();
    assert!(
        error.contains("demo.toml")
            && error.contains("parallelism.pipeline")
            && error.contains("equal lengths"),
        "{error}"
    );
}

#[test]
fn derived_values_are_exact_integers() {
    let sweep = sweep(
        "[axes]\n\"parallelism.tensor\" = [1, 2, 3]\n[derived]\n\"parallelism.data\" = \"gpus / (tensor * pipeline)\"\n",
    )
    .unwrap();
    let two = sweep.configuration(1);
    assert_eq!(value_of(&two, &sweep, "parallelism.data"), serde_json::json!(8));
    assert_eq!(two.prepared.unwrap()["parallelism"]["data"].as_integer(), Some(8));
    let three = sweep.configuration(2);
    let (status, message) = three.prepared.clone().unwrap_err();
    assert_eq!(status, Status::Failed);
    assert!(
        message.contains("parallelism.data")
            && message.contains("16 / 3")
            && message.contains("not an integer"),
        "{message}"
    );
    assert_eq!(value_of(&three, &sweep, "parallelism.data"), serde_json::Value::Null);
}

#[test]
fn filters_skip_with_their_reason_before_derivations_fail() {
    let sweep = sweep(
        "[axes]\n\"parallelism.tensor\" = [1, 3, 16]\n[derived]\n\"parallelism.data\" = \"gpus / tensor\"\n\
         [[filter]]\nwhen = \"gpus % tensor != 0\"\nreason = \"tensor must divide the GPUs\"\n\
         [[filter]]\nwhen = \"data < 2\"\nreason = \"no data parallelism\"\n",
    )
    .unwrap();
    assert!(sweep.configuration(0).prepared.is_ok());
    assert_eq!(
        sweep.configuration(1).prepared.unwrap_err(),
        (Status::Skipped, "tensor must divide the GPUs".into())
    );
    assert_eq!(sweep.configuration(2).prepared.unwrap_err(), (Status::Skipped, "no data parallelism".into()));
}

#[test]
fn bad_input_names_the_file_and_the_key() {
    for (rest, needles) in [
        ("[axes]\n\"cluster.nodez\" = [1]\n", &["axes.\"cluster.nodez\"", "nodez"][..]),
        ("[axes]\n\"cluster.nodes\" = [\"two\"]\n", &["axes.\"cluster.nodes\"", "\"two\""]),
        ("[axes]\n\"cluster.nodes\" = []\n", &["axes.\"cluster.nodes\"", "empty"]),
        ("[axes]\n\"cluster.nodes\" = { from = 1, to = 4 }\n", &["axes.\"cluster.nodes\"", "step"]),
        (
            "[derived]\n\"parallelism.data\" = \"gpus / (tensor\"\n",
            &["derived.\"parallelism.data\"", "column 15", "`)`"],
        ),
        (
            "[derived]\n\"parallelism.data\" = \"gpus / tensr\"\n",
            &["derived.\"parallelism.data\"", "`tensr`"],
        ),
        ("[derived]\n\"workload.model\" = \"gpus\"\n", &["derived.\"workload.model\"", "numbers"]),
        ("[[filter]]\nwhen = \"nodes >\"\nreason = \"x\"\n", &["filter[0].when", "column 8"]),
        ("[[filter]]\nwhen = \"nodes > 1\"\nreason = \"\"\n", &["filter[0].reason"]),
        ("[[filter]]\nwhen = \"1\"\nreason = \"x\"\n", &["filter[0].when", "\"1\"", "never true or false"]),
        ("[[filter]]\nwhen = \"nodes * 2\"\nreason = \"x\"\n", &["filter[0].when", "never true or false"]),
        ("[[filter]]\nwhen = \"-1\"\nreason = \"x\"\n", &["filter[0].when", "never true or false"]),
        ("[[filter]]\nwhen = \"nodes > 1\"\n", &["filter[0]", "reason"]),
        ("[axis]\n", &["axis", "unknown field"]),
        (
            "[axes]\n\"cluster.nodes\" = { from = 1, to = 2000000, step = 1 }\n\"cluster.gpus-per-node\" = [1, 2]\n",
            &["more than 1000000"],
        ),
        (
            "[axes]\n\"cluster.nodes\" = { from = 1, to = 1000000, step = 1 }\n\"cluster.gpus-per-node\" = [1, 2]\n",
            &["2,000,000 configurations", "cluster.nodes 1000000 x cluster.gpus-per-node 2"],
        ),
    ] {
        let error = sweep(rest).unwrap_err().to_string();
        assert!(error.contains("sweeps/demo.toml"), "{rest}: {error}");
        for needle in needles {
            assert!(error.contains(needle), "{rest}: expected {needle:?} in {error}");
        }
    }
    let error = Sweep::parse("base = 3\n", Path::new("s.toml")).unwrap_err().to_string();
    assert!(error.contains("s.toml: key `base`"), "{error}");
    let error = Sweep::parse("base = \"missing.toml\"\n", Path::new("s.toml")).unwrap_err().to_string();
    assert!(error.contains("key `base`") && error.contains("missing.toml"), "{error}");
}

#[test]
fn a_broken_configuration_is_a_failed_row_and_a_big_one_does_not_fit() {
    let sweep =
        sweep("[axes]\n\"cluster.nodes\" = [0, 1]\n\"workload.batch-per-device\" = [8, 100000]\n").unwrap();
    let broken = sweep.run(0);
    assert_eq!(broken.status, Status::Failed);
    assert!(broken.error.contains("cluster.nodes"), "{}", broken.error);
    let ok = sweep.run(2);
    assert_eq!(ok.status, Status::Ok, "{}", ok.error);
    let columns = metric_columns();
    let at = |name: &str| columns.iter().position(|c| c == name).unwrap();
    assert_eq!(ok.metrics[at("cluster.gpus")], serde_json::json!(8));
    assert!(ok.metrics[at("iteration_time_s")].as_f64().unwrap() > 0.0);
    let big = sweep.run(3);
    assert_eq!(big.status, Status::DoesNotFit);
    assert!(big.error.contains("does not fit") && !big.error.contains('\n'), "{}", big.error);
    let (total, capacity) = (
        big.metrics[at("memory.total")].as_u64().unwrap(),
        big.metrics[at("memory.capacity")].as_u64().unwrap(),
    );
    assert!(total > capacity);
    // The margin of a configuration that does not fit: negative, in bytes and as a fraction.
    assert_eq!(big.metrics[at("memory.spare")].as_i64().unwrap(), capacity as i64 - total as i64);
    assert!(big.metrics[at("memory.spare_fraction")].as_f64().unwrap() < 0.0);
    assert!(big.error.contains("over by "), "{}", big.error);
}

#[test]
fn metric_columns_flatten_the_json_summary() {
    let columns = metric_columns();
    for name in [
        "iteration_time_s",
        "samples_per_second",
        "mfu",
        "breakdown.exposed_by_group_s.data",
        "memory.total",
        "model.name",
        "tokens_per_second",
    ] {
        assert!(columns.iter().any(|c| c == name), "missing {name} in {columns:?}");
    }
    assert!(
        !columns
            .iter()
            .any(|c| c == "scenario" || c.starts_with("stages") || c.starts_with("iteration_times"))
    );
}

#[test]
fn metric_columns_hold_every_optional_key_and_no_swept_name() {
    let columns = metric_columns();
    for name in [
        "breakdown.offload_stall_s",
        "breakdown.input_bound_s",
        "breakdown.exposed_by_group_s.spatial",
        "breakdown.exposed_by_group_s.filter",
        "breakdown.exposed_by_group_s.channel",
        "strategy.daso.global_bytes",
        "strategy.daso.global_sync_every",
        "strategy.offload.to_host_bytes",
        "strategy.input.broadcast_rate",
        "strategy.input_copy_bytes",
        "strategy.spatial",
        "strategy.spatial_dims",
        "strategy.filter",
        "strategy.channel",
        "strategy.zero_implementation",
        "strategy.pipeline_host_sync",
        "framework.name",
    ] {
        assert!(columns.iter().any(|c| c == name), "missing {name} in {columns:?}");
    }
    let mut sorted = columns.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, columns, "sorted by name, each once");
    assert!(
        !columns
            .iter()
            .any(|c| c.starts_with(AXIS_PREFIX) || ["index", "status", "error"].contains(&c.as_str()))
    );
}

#[test]
fn node_groups_add_their_device_types_columns_and_nothing_else_does() {
    let plain = sweep("[axes]\n\"cluster.nodes\" = [1, 2]\n").unwrap();
    assert!(plain.device_types().is_empty());
    assert_eq!(plain.metric_columns(), metric_columns());
    assert_eq!(plain.metric_kinds(), metric_kinds());
    // Two groups of one device written two ways, one of another: two types, catalog-named, in
    // order of first appearance.
    let mixed = Sweep::parse(
        r#"
[base.cluster]
nodes = 3
[[base.cluster.node-groups]]
nodes = 1
device = "H100-SXM5-80GB"
[[base.cluster.node-groups]]
nodes = 1
device = "a100-sxm4-80gb"
[[base.cluster.node-groups]]
nodes = 1
device = "h100-sxm5-80gb"
[base.workload]
model = "resnet18"
batch-per-device = 8
[axes]
"workload.batch-per-device" = [8, 16]
"#,
        Path::new("sweeps/mixed.toml"),
    )
    .unwrap();
    assert_eq!(mixed.device_types(), ["h100-sxm5-80gb", "a100-sxm4-80gb"]);
    let columns = mixed.metric_columns();
    let added: Vec<&String> = columns.iter().filter(|c| !metric_columns().contains(c)).collect();
    assert_eq!(added.len(), 2 * 5, "{added:?}");
    for name in ["devices.h100-sxm5-80gb.busy", "devices.a100-sxm4-80gb.mfu", "devices.a100-sxm4-80gb.gpus"] {
        assert!(added.iter().any(|c| *c == name), "missing {name} in {added:?}");
    }
    let mut sorted = columns.clone();
    sorted.sort();
    assert_eq!(sorted, columns, "sorted by name");
    assert_eq!(mixed.metric_kinds().len(), columns.len());
    assert_eq!(mixed.columns().len(), 1 + 1 + columns.len() + 2);
    // A row: the cells of the device columns are set.
    let row = mixed.run(0);
    assert_eq!(row.status, Status::Ok, "{}", row.error);
    let busy = columns.iter().position(|c| c == "devices.a100-sxm4-80gb.busy").unwrap();
    let busy = row.metrics[busy].as_f64().unwrap();
    assert!(busy > 0.0 && busy <= 1.0, "{busy}");
}

#[test]
fn a_swept_key_named_like_a_metric_is_one_column_under_axis() {
    let sweep =
        sweep("[axes]\n\"cluster.nodes\" = [1, 2]\n[derived]\n\"parallelism.data\" = \"gpus\"\n").unwrap();
    let columns = sweep.columns();
    assert_eq!(columns[..3], ["index", "axis.cluster.nodes", "axis.parallelism.data"]);
    for name in ["axis.cluster.nodes", "cluster.nodes"] {
        assert_eq!(columns.iter().filter(|c| *c == name).count(), 1, "{name} in {columns:?}");
    }
}

fn header(shard: Option<Shard>) -> Header {
    Header {
        file: "demo.toml".into(),
        configurations: 5,
        fingerprint: 0xabc,
        shard,
        columns: vec!["index".into(), "cluster.nodes".into(), "status".into(), "error".into()],
    }
}

fn row(index: u64) -> Row {
    Row {
        index,
        values: vec![index.into()],
        metrics: vec![],
        status: Status::Failed,
        error: "a, \"quoted\" # error".into(),
    }
}

#[test]
fn headers_and_rows_round_trip_in_both_formats() {
    for format in [Format::Csv, Format::Jsonl] {
        let header = header(Some(Shard { index: 1, count: 2 }));
        let mut text = header.text(format);
        let columns = header.columns.clone();
        text += &encode_row(format, &columns, &row(1));
        text += &encode_row(format, &columns, &row(3))[..5];
        let existing = read_existing(&text, format, &Kind::columns(1, [])).unwrap();
        assert_eq!(existing.header, header);
        assert_eq!(existing.rows, [1]);
        assert_eq!(&text[existing.complete_len..], &encode_row(format, &columns, &row(3))[..5]);
    }
    let line = encode_row(Format::Csv, &header(None).columns, &row(2));
    // A `#` in a field quotes every field (csv_text: pandas' comment="#" keeps it whole).
    assert_eq!(line, "\"2\",\"2\",\"failed\",\"a, \"\"quoted\"\" # error\"\n");
    let line = encode_row(Format::Jsonl, &header(None).columns, &row(2));
    assert_eq!(
        line,
        "{\"index\":2,\"cluster.nodes\":2,\"status\":\"failed\",\"error\":\"a, \\\"quoted\\\" # error\"}\n"
    );
}

#[test]
fn merge_checks_shards() {
    let file = |shard: Option<Shard>, rows: &[u64]| {
        let header = header(shard);
        let mut text = header.text(Format::Csv);
        for &i in rows {
            text += &encode_row(Format::Csv, &header.columns, &row(i));
        }
        text
    };
    let whole = file(None, &[0, 1, 2, 3, 4]);
    let a = ("a.csv".to_string(), file(Some(Shard { index: 0, count: 2 }), &[0, 2, 4]));
    let b = ("b.csv".to_string(), file(Some(Shard { index: 1, count: 2 }), &[1, 3]));
    assert_eq!(merge(&[b.clone(), a.clone()]).unwrap(), whole);
    let short = ("b.csv".to_string(), file(Some(Shard { index: 1, count: 2 }), &[1]));
    assert!(merge(&[a.clone(), short]).unwrap_err().contains("b.csv is incomplete"));
    assert!(merge(std::slice::from_ref(&a)).unwrap_err().contains("3 of 5 configurations: 2 are missing"));
    assert!(merge(&[a.clone(), a.clone()]).unwrap_err().contains("overlap"));
    let mut other = b.clone();
    other.1 = other.1.replace("fingerprint=0000000000000abc", "fingerprint=0000000000000abd");
    assert!(merge(&[a.clone(), other]).unwrap_err().contains("another sweep"));
    let mut partial = b.clone();
    partial.1.push_str("5,");
    assert!(merge(&[a, partial]).unwrap_err().contains("partial row"));
}

#[test]
fn shards_slice_interleaved() {
    let shard = Shard::parse("1/3").unwrap();
    assert_eq!(shard.indices(8).collect::<Vec<_>>(), [1, 4, 7]);
    assert!(Shard::parse("3/3").unwrap_err().contains("0 to 2"));
    assert!(Shard::parse("1").is_err());
}

/// `--resume` keeps only rows of this sweep's shape: a complete but corrupt row, the other
/// format's content, or a row of other columns is refused, naming the line.
#[test]
fn kept_rows_are_checked_against_the_columns_and_types() {
    let header = Header {
        columns: ["index", "axis.x", "iteration_time_s", "status", "error"].map(String::from).to_vec(),
        ..header(None)
    };
    let kinds = Kind::columns(1, [Kind::Number]);
    let good = Row {
        index: 0,
        values: vec!["a".into()],
        metrics: vec![0.5.into()],
        status: Status::Ok,
        error: String::new(),
    };
    for format in [Format::Csv, Format::Jsonl] {
        let text = header.text(format) + &encode_row(format, &header.columns, &good);
        assert_eq!(read_existing(&text, format, &kinds).unwrap().rows, [0]);
        let other = match format {
            Format::Csv => Format::Jsonl,
            Format::Jsonl => Format::Csv,
        };
        let error = read_existing(&text, other, &kinds).unwrap_err();
        assert!(error.starts_with("line 1: the file holds"), "{error}");
    }
    let cases = [
        (Format::Csv, "0,a,fast,ok,\n", "column iteration_time_s holds \"fast\", not a number"),
        (Format::Csv, "0,a,0.5,ok\n", "4 fields where the header has 5 columns"),
        (Format::Csv, "0,a,0.5,done,\n", "column status holds \"done\""),
        (Format::Csv, "{\"index\":0}\n", "a JSON Lines row in CSV"),
        (
            Format::Jsonl,
            "{\"index\":0,\"axis.x\":1,\"iteration_time_s\":\"x\",\"status\":\"ok\",\"error\":\"\"}\n",
            "key \"iteration_time_s\" holds \"x\"",
        ),
        (Format::Jsonl, "{\"index\":0,\"axis.x\":1}\n", "2 keys where the header has 5 columns"),
        (Format::Jsonl, "0,a,0.5,ok,\n", "not a JSON object"),
    ];
    for (format, row, reason) in cases {
        let text = header.text(format) + row;
        // CSV has two header lines, JSON Lines one.
        let line = if format == Format::Csv { 3 } else { 2 };
        let error = read_existing(&text, format, &kinds).unwrap_err();
        assert!(error.starts_with(&format!("line {line}: ")) && error.contains(reason), "{row}: {error}");
    }
}
