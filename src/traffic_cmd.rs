//! `parasim traffic`: any traffic matrix on a scenario's cluster, every flow one fluid flow of
//! the max-min fair flow network; completion time, per-flow completion percentiles, throughput
//! against offered load and the most loaded links.
//!
//! Hosts are the cluster's GPUs, numbered as ranks (GPU `i` of server `n` is host
//! `n * gpus-per-node + i`); a flow between two GPUs of one server crosses its NVLink or PCIe
//! links, a flow between servers also its NICs and the fabric.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sim_core::exec;
use sim_core::flow::FlowNetwork;
use sim_core::graph::{GraphBuilder, OpId, RankId, StreamId};
use sim_core::units::{Bytes, SimDuration, SimTime};
use topology::{FabricSpec, HostId, Topology};

use crate::output::stderr;
use scenario::Cluster;
use scenario::links::LinkLoad;

/// Flows a pattern may have by default (`--max-flows`): a 1,024-host all-to-all (1,047,552)
/// fits, a 16,384-host one (268 M) is refused before anything is allocated.
pub const DEFAULT_MAX_FLOWS: u64 = 1 << 20;

/// The built-in patterns, for messages.
const PATTERNS: &str = "permutation, shift K, all-to-all, incast N, bisection, uniform-random, adversarial, or a file of src,dst,bytes[,start] rows";

/// What to run.
pub struct Options<'a> {
    /// Scenario whose [cluster] is used.
    pub cluster: &'a Path,
    /// The pattern's name, or a file.
    pub pattern: &'a str,
    /// The pattern's argument (shift K, incast N).
    pub argument: Option<&'a str>,
    /// Seed of permutation and uniform-random.
    pub seed: u64,
    /// Flows of uniform-random.
    pub flows: Option<u64>,
    /// Bytes of every flow of a built-in pattern.
    pub size: &'a str,
    /// Refuse patterns with more flows than this.
    pub max_flows: u64,
    /// Print JSON.
    pub json: bool,
    /// Print one CSV row per flow.
    pub csv: bool,
}

/// One flow of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Sending host (GPU rank).
    pub src: u32,
    /// Receiving host.
    pub dst: u32,
    /// Bytes it carries.
    pub bytes: u64,
    /// When it starts.
    pub start: SimDuration,
}

/// A traffic pattern (see [`PATTERNS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Permutation { seed: u64 },
    Shift { k: u64 },
    AllToAll,
    Incast { senders: u64 },
    Bisection,
    UniformRandom { flows: u64, seed: u64 },
    Adversarial { groups: u64 },
}

impl Pattern {
    /// The pattern named `name` on a cluster of `hosts` (checked against it).
    fn parse(options: &Options, hosts: u64, fabric: &FabricSpec) -> anyhow::Result<Option<Pattern>> {
        let number = |what: &str| -> anyhow::Result<u64> {
            let Some(text) = options.argument else {
                bail!("pattern {}: give {what}, e.g. `{} 1`", options.pattern, options.pattern);
            };
            text.trim().parse::<u64>().with_context(|| {
                format!("pattern {} {text:?}: {what} must be a whole number", options.pattern)
            })
        };
        let no_argument = |pattern: Pattern| -> anyhow::Result<Option<Pattern>> {
            if let Some(extra) = options.argument {
                bail!("pattern {} takes no argument, got {extra:?}", options.pattern);
            }
            Ok(Some(pattern))
        };
        let builtin = PATTERNS.split(", ").any(|p| p.split(' ').next() == Some(options.pattern));
        if hosts < 2 && builtin {
            bail!("the cluster has {hosts} GPU; a traffic pattern needs at least 2");
        }
        let pattern = match options.pattern {
            "permutation" => no_argument(Pattern::Permutation { seed: options.seed })?,
            "shift" => {
                let k = number("the shift K")?;
                if k % hosts == 0 {
                    bail!(
                        "pattern shift {k}: on {hosts} hosts every host would send to itself; give K from 1 to {}",
                        hosts - 1
                    );
                }
                Some(Pattern::Shift { k: k % hosts })
            }
            "all-to-all" => no_argument(Pattern::AllToAll)?,
            "incast" => {
                let senders = number("the number of senders N")?;
                if senders == 0 || senders >= hosts {
                    bail!(
                        "pattern incast {senders}: hosts 1..=N send to host 0, so N must be 1 to {}",
                        hosts - 1
                    );
                }
                Some(Pattern::Incast { senders })
            }
            "bisection" => no_argument(Pattern::Bisection)?,
            "uniform-random" => {
                let Some(flows) = options.flows else {
                    bail!("pattern uniform-random: give the number of flows with --flows F (and --seed N)");
                };
                if flows == 0 {
                    bail!("pattern uniform-random: --flows must be at least 1");
                }
                if options.argument.is_some() {
                    return no_argument(Pattern::UniformRandom { flows, seed: options.seed });
                }
                Some(Pattern::UniformRandom { flows, seed: options.seed })
            }
            "adversarial" => {
                let groups = match fabric {
                    FabricSpec::Dragonfly(spec) => u64::from(spec.groups),
                    FabricSpec::CascadeDragonfly(spec) => u64::from(spec.groups),
                    _ => bail!(
                        "pattern adversarial: every host of dragonfly group g sends to group g+1, but {} is not a dragonfly; use shift K or a file",
                        options.cluster.display()
                    ),
                };
                if groups < 2 {
                    bail!("pattern adversarial: the dragonfly has one group; there is no group g+1");
                }
                no_argument(Pattern::Adversarial { groups })?
            }
            _ => None,
        };
        Ok(pattern)
    }

    /// How many flows the pattern has on `hosts` hosts (before any is made).
    fn count(&self, hosts: u64) -> u64 {
        match *self {
            Pattern::Permutation { .. } | Pattern::Shift { .. } | Pattern::Adversarial { .. } => hosts,
            Pattern::AllToAll => hosts.saturating_mul(hosts - 1),
            Pattern::Incast { senders } => senders,
            Pattern::Bisection => hosts / 2 * 2,
            Pattern::UniformRandom { flows, .. } => flows,
        }
    }

    /// The flows, every one of `bytes` starting at zero.
    fn flows(&self, hosts: u32, bytes: u64) -> Vec<Flow> {
        let flow = |src: u32, dst: u32| Flow { src, dst, bytes, start: SimDuration::ZERO };
        match *self {
            Pattern::Permutation { seed } => {
                let mut order: Vec<u32> = (0..hosts).collect();
                order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
                // Hosts the shuffle maps to themselves send nothing.
                (0..hosts).filter(|&h| order[h as usize] != h).map(|h| flow(h, order[h as usize])).collect()
            }
            Pattern::Shift { k } => {
                (0..hosts).map(|h| flow(h, ((u64::from(h) + k) % u64::from(hosts)) as u32)).collect()
            }
            Pattern::AllToAll => (0..hosts)
                .flat_map(|src| (0..hosts).filter(move |&dst| dst != src).map(move |dst| flow(src, dst)))
                .collect(),
            Pattern::Incast { senders } => (1..=senders as u32).map(|src| flow(src, 0)).collect(),
            Pattern::Bisection => {
                let half = hosts / 2;
                (0..half).flat_map(|h| [flow(h, h + half), flow(h + half, h)]).collect()
            }
            Pattern::UniformRandom { flows, seed } => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                (0..flows)
                    .map(|_| {
                        let src = rng.random_range(0..hosts);
                        // Any other host, uniformly.
                        let other = rng.random_range(0..hosts - 1);
                        flow(src, if other >= src { other + 1 } else { other })
                    })
                    .collect()
            }
            Pattern::Adversarial { groups } => {
                let per_group = u64::from(hosts) / groups;
                (0..hosts)
                    .map(|h| flow(h, ((u64::from(h) + per_group) % (per_group * groups)) as u32))
                    .filter(|f| u64::from(f.src) < per_group * groups)
                    .collect()
            }
        }
    }
}

/// `8`, `1K`, `16M` (powers of 1024) or a size with a unit (`"1 MiB"`).
fn size(text: &str) -> anyhow::Result<u64> {
    crate::collective_cmd::size(text)
}

/// Reads a traffic file: `src,dst,bytes[,start]` rows (a first row `src,dst,...` is a
/// header; `#` starts a comment). Refuses more than `max_flows` rows as it reads. A file
/// whose header is `--csv`'s (`src,dst,bytes,start_s,finish_s`) reads back: `start_s` is in
/// plain seconds and `finish_s` is ignored.
pub fn read_file(path: &Path, hosts: u32, max_flows: u64) -> anyhow::Result<Vec<Flow>> {
    let file = fs_err::File::open(path).context("reading the traffic file")?;
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .from_reader(file);
    let mut flows = Vec::new();
    let name = path.display();
    // `--csv`'s own header: starts in plain seconds, and a fifth column of finish times.
    let mut seconds = false;
    for record in reader.records() {
        let record = record.map_err(|error| {
            let line = error.position().map_or(0, |p| p.line());
            anyhow::anyhow!("{name}: line {line}: {error}")
        })?;
        let line = record.position().map_or(0, |p| p.line());
        if flows.is_empty() && record.get(0) == Some("src") {
            seconds = record.get(3) == Some("start_s");
            continue; // the header
        }
        let most = if seconds { 5 } else { 4 };
        if record.len() < 3 || record.len() > most {
            bail!(
                "{name}: line {line}: {} fields; a row is src,dst,bytes[,start] (e.g. 0,5,16M or 0,5,\"1 MiB\",10 us)",
                record.len()
            );
        }
        if flows.len() as u64 >= max_flows {
            bail!(
                "{name}: more than {max_flows} flows (--max-flows); sample the matrix (e.g. uniform-random --flows {max_flows}) or raise --max-flows"
            );
        }
        let host = |field: usize, what: &str| -> anyhow::Result<u32> {
            let text = &record[field];
            let host: u32 = text.parse().map_err(|_| {
                anyhow::anyhow!(
                    "{name}: line {line}: {what} {text:?} is not a host number (0 to {})",
                    hosts - 1
                )
            })?;
            if host >= hosts {
                bail!(
                    "{name}: line {line}: {what} host {host} does not exist; the cluster has hosts 0 to {}",
                    hosts - 1
                );
            }
            Ok(host)
        };
        let (src, dst) = (host(0, "src")?, host(1, "dst")?);
        if src == dst {
            bail!("{name}: line {line}: src and dst are both host {src}; a flow needs two hosts");
        }
        let bytes =
            size(&record[2]).map_err(|error| anyhow::anyhow!("{name}: line {line}: bytes: {error:#}"))?;
        if bytes == 0 {
            bail!("{name}: line {line}: bytes is 0; a flow carries at least one byte");
        }
        let start = match record.get(3) {
            None | Some("" | "0") => SimDuration::ZERO,
            Some(text) if seconds => {
                text.parse::<f64>().ok().and_then(|s| SimDuration::from_secs_f64(s).ok()).ok_or_else(
                    || {
                        anyhow::anyhow!(
                            "{name}: line {line}: start_s {text:?} is not a number of seconds at or after 0"
                        )
                    },
                )?
            }
            Some(text) => text.parse::<SimDuration>().map_err(|error| {
                anyhow::anyhow!("{name}: line {line}: start {text:?}: {error} (write e.g. \"10 us\")")
            })?,
        };
        flows.push(Flow { src, dst, bytes, start });
    }
    if flows.is_empty() {
        bail!("{name}: no flows; a row is src,dst,bytes[,start]");
    }
    Ok(flows)
}

/// When each flow finished, and the bytes every link carried.
pub struct Outcome {
    /// Each flow's last byte's arrival.
    pub finish: Vec<SimTime>,
    /// Bytes carried per link ([`topology::LinkId`]).
    pub link_bytes: Vec<f64>,
    /// Bytes sent and delivered, when audited (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub audit: Option<(f64, f64)>,
}

/// Runs `flows` on `topology`, every flow one fluid flow (each on its own stream of its
/// source, after a wait of its start time). With `audit`, counts the bytes sent and delivered
/// and checks every re-fill (slower; for tests).
pub fn simulate(topology: &Topology, flows: &[Flow], audit: bool) -> anyhow::Result<Outcome> {
    let hosts = topology.host_count() as u32;
    let mut graph = GraphBuilder::new(hosts);
    // Every flow is its own op (its own stream): nothing to find twice.
    graph.distinct_ops();
    graph.reserve(flows.len() * 2, flows.len());
    let mut streams = vec![0u32; hosts as usize];
    let mut ops: Vec<OpId> = Vec::with_capacity(flows.len());
    for flow in flows {
        let stream = &mut streams[flow.src as usize];
        if *stream > u32::from(u16::MAX) {
            bail!(
                "host {} sends more than {} flows; the simulator gives each of a host's flows its own stream, at most {} per host",
                flow.src,
                u16::MAX,
                u16::MAX
            );
        }
        let id = StreamId(*stream as u16);
        *stream += 1;
        let (src, dst) = (RankId(flow.src), RankId(flow.dst));
        let deps = if flow.start > SimDuration::ZERO {
            vec![graph.compute(src, id, flow.start, "wait", &[])]
        } else {
            Vec::new()
        };
        ops.push(graph.transfer(src, id, dst, Bytes(flow.bytes), "flow", &deps));
    }
    let graph = graph.build().context("building the flows")?;
    let mut network = FlowNetwork::new(topology).recording_link_bytes().reserving_flows(flows.len());
    if audit {
        network = network.audited();
    }
    let timeline = exec::run(&graph, &mut network).context("running the flows")?;
    let finish = ops.iter().map(|op| timeline.end[op.0 as usize]).collect();
    let link_bytes = network.link_bytes().map(<[f64]>::to_vec).unwrap_or_default();
    let audit = network.audit().map(|a| {
        if let Some(violation) = &a.violation {
            stderr!("audit: {violation}");
        }
        (a.bytes_sent, a.bytes_delivered)
    });
    Ok(Outcome { finish, link_bytes, audit })
}

/// `run --json`: the summary, then the busiest links (`null` under `analytical`, which does
/// not route flows).
#[derive(Serialize)]
pub struct RunJson<'a> {
    /// Every key `run --json` had before.
    #[serde(flatten)]
    pub summary: &'a scenario::simulation::Summary,
    /// The 10 links with the highest mean utilisation over the simulated iterations.
    pub busiest_links: Option<Vec<LinkLoad>>,
    /// The busiest link of each kind (NVLink, PCIe, NIC, leaf-spine, ...), busiest first.
    pub busiest_link_per_kind: Option<Vec<LinkLoad>>,
}

/// The first (busiest) link of each kind in `links`, sorted busiest first.
pub fn per_kind(links: &[LinkLoad]) -> Vec<LinkLoad> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for link in links {
        if !seen.contains(&link.kind) {
            seen.push(link.kind);
            out.push(link.clone());
        }
    }
    out
}

/// Every link of a `run` that carried bytes, busiest first (mean utilisation over every
/// simulated iteration), under `flow` and `packet-steps`; `None` under `analytical`.
pub fn run_links(
    scenario: &scenario::Scenario,
    outcome: &scenario::simulation::Outcome,
) -> anyhow::Result<Option<Vec<LinkLoad>>> {
    let Some(bytes) = &outcome.link_bytes else { return Ok(None) };
    // The fabric as run: a degraded link's utilisation is over the capacity it had.
    let topology = scenario::simulation::topology(scenario)?;
    Ok(Some(scenario::links::busiest(
        &topology,
        bytes,
        outcome.timeline.makespan().as_secs_f64(),
        usize::MAX,
    )))
}

/// The busiest link of each kind as the human report prints them (a line saying they are not available
/// under `analytical`).
pub fn links_text(links: Option<&[LinkLoad]>) -> String {
    let Some(links) = links else {
        return "\nlinks: per-link utilisation needs the flow network (fidelity flow or packet-steps)\n"
            .to_string();
    };
    let mut out = String::from(
        "\nbusiest link of each kind (mean utilisation over the simulated iterations, bytes carried):\n",
    );
    for link in &per_kind(links) {
        let _ = writeln!(
            out,
            "  {:>5.1}%  {:>11}  {:<11}  {}",
            100.0 * link.utilisation,
            Bytes(link.bytes as u64).to_string(),
            link.kind,
            link.name
        );
    }
    out
}

/// One flow of `--json` and `--csv`.
#[derive(Debug, Serialize)]
struct FlowJson {
    src: u32,
    dst: u32,
    bytes: u64,
    start_s: f64,
    finish_s: f64,
}

/// Per-flow completion times (finish - start), seconds.
#[derive(Debug, Serialize)]
struct Percentiles {
    p50_s: f64,
    p90_s: f64,
    p99_s: f64,
    max_s: f64,
}

/// `parasim traffic --json`.
#[derive(Debug, Serialize)]
struct TrafficJson<'a> {
    scenario: String,
    pattern: String,
    /// Hosts are GPU ranks.
    hosts: u32,
    flows: usize,
    bytes: u64,
    completion_time_s: f64,
    flow_completion: Percentiles,
    throughput_bytes_per_s: f64,
    /// The sum over sending hosts of their line rate (the first link of their flows' routes).
    offered_bytes_per_s: f64,
    /// throughput / offered.
    efficiency: f64,
    busiest_links: Vec<LinkLoad>,
    /// Wall time and peak memory of this run (the only keys that vary between runs).
    machine: &'a Machine,
    per_flow: Vec<FlowJson>,
}

/// Runs the command and returns its output.
pub fn traffic(options: &Options) -> anyhow::Result<String> {
    let cluster =
        Cluster::load(options.cluster).with_context(|| format!("--cluster {}", options.cluster.display()))?;
    // The fabric with the file's [faults]: links degraded or down, for a while, latency noise.
    let topology = cluster.fabric(options.cluster).context("building the cluster topology")?;
    let hosts = topology.host_count() as u32;
    let bytes = size(options.size).context("--size")?;
    if bytes == 0 {
        bail!("--size 0: a flow carries at least one byte");
    }
    let (label, flows) = match Pattern::parse(options, u64::from(hosts), &cluster.spec.network.fabric)? {
        Some(pattern) => {
            let count = pattern.count(u64::from(hosts));
            if count > options.max_flows {
                bail!(
                    "pattern {}: {count} flows on {hosts} hosts, more than the limit of {} (--max-flows); sample it with uniform-random --flows {} --seed N, or raise --max-flows",
                    options.pattern,
                    options.max_flows,
                    // About one flow per host runs in a second; a sample at the limit can
                    // take minutes where it contends.
                    options.max_flows.min(u64::from(hosts))
                );
            }
            let label = match options.argument {
                Some(argument) => format!("{} {argument}", options.pattern),
                None => options.pattern.to_string(),
            };
            (label, pattern.flows(hosts, bytes))
        }
        None => {
            let path = Path::new(options.pattern);
            if !path.is_file() {
                if options.pattern.contains(['.', '/']) {
                    bail!("traffic file {}: no such file (or give a pattern: {PATTERNS})", path.display());
                }
                bail!("unknown pattern {:?}; valid: {PATTERNS}", options.pattern);
            }
            if options.argument.is_some() {
                bail!("a traffic file takes no argument, got {:?}", options.argument.unwrap_or_default());
            }
            (path.display().to_string(), read_file(path, hosts, options.max_flows)?)
        }
    };
    if flows.is_empty() {
        bail!("pattern {label}: no flows on this cluster (every host maps to itself)");
    }
    let started = Instant::now();
    let outcome = simulate(&topology, &flows, false)?;
    let wall = started.elapsed().as_secs_f64();
    stderr!("simulated {} flows in {:.3} ms of wall time", flows.len(), wall * 1e3);
    let machine = Machine { wall_s: wall, peak_resident_memory_bytes: crate::bench::peak_resident_memory() };
    report(options, &cluster, &topology, &label, &flows, &outcome, &machine)
}

/// What the run cost on this machine (varies from run to run, unlike everything else in the
/// report).
#[derive(Debug, Serialize)]
struct Machine {
    /// Wall time of the simulation (building the flows' graph and running it), in seconds.
    wall_s: f64,
    /// The process's peak resident set so far (Linux `VmHWM`), in bytes; `null` where the
    /// system does not report it.
    peak_resident_memory_bytes: Option<u64>,
}

fn report(
    options: &Options,
    cluster: &Cluster,
    topology: &Topology,
    label: &str,
    flows: &[Flow],
    outcome: &Outcome,
    machine: &Machine,
) -> anyhow::Result<String> {
    let completion = outcome.finish.iter().max().copied().unwrap_or(SimTime::ZERO).since_start();
    let seconds = completion.as_secs_f64();
    let mut histogram = Histogram::<u64>::new(3).context("the completion histogram")?;
    let mut longest = SimDuration::ZERO;
    for (flow, finish) in flows.iter().zip(&outcome.finish) {
        let fct = finish.since_start().saturating_sub(flow.start);
        longest = longest.max(fct);
        histogram.record(fct.as_ps().max(1)).context("recording a flow completion time")?;
    }
    // hdrhistogram keeps 3 significant digits; no percentile is reported above the exact max.
    let quantile =
        |q: f64| SimDuration::from_ps(histogram.value_at_quantile(q).min(longest.as_ps())).as_secs_f64();
    let percentiles = Percentiles {
        p50_s: quantile(0.5),
        p90_s: quantile(0.9),
        p99_s: quantile(0.99),
        max_s: longest.as_secs_f64(),
    };
    let total: u64 = flows.iter().map(|f| f.bytes).sum();
    // Offered: each sending host at its line rate, the first link of its flows' routes (its
    // NIC, or its NVLink / PCIe link for flows inside its server; the fastest if they differ).
    let mut line_rate = vec![0.0f64; topology.host_count()];
    for flow in flows {
        let route = topology.route(HostId(flow.src), HostId(flow.dst)).context("routing a flow")?;
        let first = route.first().map_or(0.0, |&l| topology.link(l).bandwidth.bytes_per_second());
        let slot = &mut line_rate[flow.src as usize];
        *slot = slot.max(first);
    }
    let offered: f64 = line_rate.iter().sum();
    let throughput = if seconds > 0.0 { total as f64 / seconds } else { 0.0 };
    let links = scenario::links::busiest(topology, &outcome.link_bytes, seconds, 10);
    let per_flow = || {
        flows.iter().zip(&outcome.finish).map(|(flow, finish)| FlowJson {
            src: flow.src,
            dst: flow.dst,
            bytes: flow.bytes,
            start_s: flow.start.as_secs_f64(),
            finish_s: finish.since_start().as_secs_f64(),
        })
    };
    if options.json {
        let report = TrafficJson {
            scenario: options.cluster.display().to_string(),
            pattern: label.to_string(),
            hosts: topology.host_count() as u32,
            flows: flows.len(),
            bytes: total,
            completion_time_s: seconds,
            flow_completion: percentiles,
            throughput_bytes_per_s: throughput,
            offered_bytes_per_s: offered,
            efficiency: if offered > 0.0 { throughput / offered } else { 0.0 },
            busiest_links: links,
            machine,
            per_flow: per_flow().collect(),
        };
        return Ok(serde_json::to_string_pretty(&report).context("writing JSON")? + "\n");
    }
    if options.csv {
        let mut writer = csv::Writer::from_writer(Vec::new());
        // The header comes from the fields' names with the first row.
        for flow in per_flow() {
            writer.serialize(flow).context("writing CSV")?;
        }
        let bytes = writer.into_inner().context("writing CSV")?;
        return String::from_utf8(bytes).context("writing CSV");
    }
    let mut out = String::new();
    let noun = cluster.device.kind.noun();
    let _ = writeln!(
        out,
        "traffic     {label}: {} flows, {} in all, on {} {noun}s ({} x {}), fabric {}",
        flows.len(),
        Bytes(total),
        topology.host_count(),
        cluster.spec.nodes,
        cluster.spec.gpus_per_node,
        topology.fabric_name()
    );
    let _ = writeln!(out, "completion  {}", completion);
    let us = |s: f64| SimDuration::from_secs_f64(s).unwrap_or(SimDuration::ZERO);
    let _ = writeln!(
        out,
        "per flow    p50 {}  p90 {}  p99 {}  max {}",
        us(percentiles.p50_s),
        us(percentiles.p90_s),
        us(percentiles.p99_s),
        us(percentiles.max_s)
    );
    let _ = writeln!(
        out,
        "throughput  {:.2} GB/s of {:.2} GB/s offered ({:.1}%)",
        throughput / 1e9,
        offered / 1e9,
        if offered > 0.0 { 100.0 * throughput / offered } else { 0.0 }
    );
    let _ = writeln!(out, "busiest links (utilisation = bytes / (capacity x completion)):");
    let _ = writeln!(out, "  {:>6}  {:>11}  {:<11}  link", "util", "bytes", "kind");
    for link in &links {
        let _ = writeln!(
            out,
            "  {:>5.1}%  {:>11}  {:<11}  {}",
            100.0 * link.utilisation,
            Bytes(link.bytes as u64).to_string(),
            link.kind,
            link.name
        );
    }
    // Starts with "wall time ": the README's snapshot test skips such lines.
    let memory = match machine.peak_resident_memory_bytes {
        Some(bytes) => {
            format!("peak memory {:.1} MiB (this process's resident set)", bytes as f64 / 1048576.0)
        }
        None => "peak memory not reported by this system".to_string(),
    };
    let _ = writeln!(out, "wall time   {:.3} s to simulate, {memory}", machine.wall_s);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options<'a>(pattern: &'a str, argument: Option<&'a str>) -> Options<'a> {
        Options {
            cluster: Path::new("c.toml"),
            pattern,
            argument,
            seed: 1,
            flows: Some(100),
            size: "1M",
            max_flows: DEFAULT_MAX_FLOWS,
            json: false,
            csv: false,
        }
    }

    #[test]
    fn patterns_have_the_flows_they_count_and_never_send_to_self() {
        let fabric = FabricSpec::Switch {
            link: topology::LinkSpec::new("100 Gb/s".parse().unwrap(), SimDuration::ZERO),
        };
        for (name, argument) in [
            ("permutation", None),
            ("shift", Some("3")),
            ("all-to-all", None),
            ("incast", Some("5")),
            ("bisection", None),
            ("uniform-random", None),
        ] {
            let pattern = Pattern::parse(&options(name, argument), 16, &fabric).unwrap().unwrap();
            let flows = pattern.flows(16, 10);
            if name != "permutation" {
                assert_eq!(flows.len() as u64, pattern.count(16), "{name}");
            }
            assert!(flows.iter().all(|f| f.src != f.dst && f.src < 16 && f.dst < 16), "{name}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_flows_and_another_seed_others() {
        let fabric = FabricSpec::Switch {
            link: topology::LinkSpec::new("100 Gb/s".parse().unwrap(), SimDuration::ZERO),
        };
        let draw = |seed: u64| {
            let mut options = options("permutation", None);
            options.seed = seed;
            Pattern::parse(&options, 64, &fabric).unwrap().unwrap().flows(64, 1)
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn every_byte_sent_is_delivered_and_the_same_seed_gives_the_same_finishes() {
        let cluster =
            Cluster::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/fat-tree-k16.toml")))
                .unwrap();
        let topology = Topology::build(&cluster.spec).unwrap();
        let pattern = Pattern::UniformRandom { flows: 2000, seed: 3 };
        let flows = pattern.flows(1024, 1 << 20);
        let first = simulate(&topology, &flows, true).unwrap();
        let (sent, delivered) = first.audit.unwrap();
        assert_eq!(sent, 2000.0 * f64::from(1 << 20));
        assert!((sent - delivered).abs() < 1e-3 * sent, "{sent} sent, {delivered} delivered");
        let again = simulate(&topology, &flows, false).unwrap();
        assert_eq!(first.finish, again.finish);
        // Every flow's bytes are on every link of its route: the NIC links carry them all once
        // up and once down.
        let nic: f64 = (0..topology.link_count() as u32)
            .filter(|&l| topology.link_kind(topology::LinkId(l)) == "NIC")
            .map(|l| first.link_bytes[l as usize])
            .sum();
        assert_eq!(nic, 2.0 * sent);
    }
}
