//! Export of a simulated timeline as Chrome Trace Event JSON, the format Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open.
//!
//! Every rank is a process (`pid` = rank) and every stream a thread (`tid` = stream). Every op
//! is one complete (`"X"`) event whose `args` carry its id, label, what its metadata says
//! ([`sim_core::graph::OpMeta`]: `layer` and `phase` of a layer's kernel or the optimizer
//! step, and for any op its `pass`, `layer_index`, communicator `group`, emitting `policy` and,
//! off the device, its `work`), bytes, and for collectives the kind, the algorithm and
//! protocol that ran it (what `auto` resolved to, from the timeline), group size, collective id
//! and the instant the last member arrived; a collective member that waited for its peers has
//! a nested `wait for peers` slice. Every transfer is a flow
//! arrow (`"s"` on the sender, `"f"` bound to the first op that depends on it on the
//! receiver). Times are microseconds as floats (`ts`, `dur`), from picosecond integers.
//!
//! Counter tracks ([`ChromeTrace::with_counters`], e.g. the utilisation of the busiest links)
//! go into one more process after the ranks (`pid` = the graph's rank count), named by
//! [`ChromeTrace::with_counter_process`]: one counter (`"C"`) event per point, its value in
//! `args` under the track's key, which Perfetto shows as a counter track named
//! `"NAME KEY"`.
//!
//! The writer streams: memory is independent of the number of ops.
//!
//! ```
//! use sim_core::exec::run;
//! use sim_core::graph::{GraphBuilder, RankId, StreamId};
//! use sim_core::network::AnalyticalNetwork;
//! use sim_core::units::SimDuration;
//! use topology::{ClusterSpec, IntraNode, LinkSpec, NetworkSpec, Topology};
//!
//! let link = LinkSpec::new("100 Gb/s".parse()?, "1 us".parse()?);
//! let topology = Topology::build(&ClusterSpec {
//!     nodes: 2, gpus_per_node: 1, intra_node: IntraNode::NvSwitch(link),
//!     network: NetworkSpec::single_switch(link), host_memory: None,
//! })?;
//! let mut graph = GraphBuilder::new(2);
//! let work = graph.compute(RankId(0), StreamId(0), SimDuration::from_us(5), "layer1 forward", &[]);
//! let send = graph.transfer(RankId(0), StreamId(1), RankId(1), "1 MB".parse()?, "activations", &[work]);
//! graph.compute(RankId(1), StreamId(0), SimDuration::from_us(5), "layer2 forward", &[send]);
//! let graph = graph.build()?;
//! let timeline = run(&graph, &mut AnalyticalNetwork::new(&topology))?;
//!
//! let mut json = Vec::new();
//! let stats = traces::chrome::ChromeTrace::new(&graph, &timeline).write(&mut json)?;
//! assert_eq!((stats.ops, stats.flows), (3, 1));
//! let parsed: serde_json::Value = serde_json::from_slice(&json)?;
//! assert!(parsed["traceEvents"].as_array().is_some_and(|events| events.len() > 3));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, Write};

use serde::Serialize;
use sim_core::exec::Timeline;
use sim_core::graph::{ExecGraph, MemcpyDirection, Op, OpId, OpKind, Pass, RankId, StreamId, Work};
use sim_core::units::SimTime;

/// Names a (rank, stream) track.
pub type StreamNamer<'a> = &'a dyn Fn(RankId, StreamId) -> String;

/// Names a rank's process (default: "rank N").
pub type ProcessNamer<'a> = &'a dyn Fn(RankId) -> String;

/// A named slice over a run of ops on one track, drawn around them (a micro-batch's forward of
/// one pipeline stage, say): from the start of `first` to the end of `last`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The rank.
    pub rank: RankId,
    /// The stream its ops run on.
    pub stream: StreamId,
    /// What it is (`"F12"`).
    pub name: String,
    /// Its first op.
    pub first: OpId,
    /// Its last op.
    pub last: OpId,
}

/// A timeline ready to be written as Chrome Trace Event JSON.
pub struct ChromeTrace<'a> {
    graph: &'a ExecGraph,
    timeline: &'a Timeline,
    stream_name: Option<StreamNamer<'a>>,
    process_name: Option<ProcessNamer<'a>>,
    spans: &'a [Span],
    counters: &'a [CounterTrack],
    counter_process: &'a str,
}

/// A value over time, drawn as a counter track: piecewise constant, each point's value holding
/// until the next point.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterTrack {
    /// The track's name (a link's `"FROM -> TO"`).
    pub name: String,
    /// What the value is (`"utilisation"`): the key of the counter events' `args`.
    pub key: &'static str,
    /// `(time, value)` points in time order.
    pub points: Vec<(SimTime, f64)>,
}

/// What [`ChromeTrace::write`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Events written, metadata included.
    pub events: u64,
    /// Op slices written (one per op).
    pub ops: u64,
    /// Transfer flow arrows written.
    pub flows: u64,
    /// Transfers without an arrow, because nothing on the receiver depends on them.
    pub transfers_without_receiver: u64,
    /// Counter events written (points of every counter track).
    pub counter_points: u64,
}

#[derive(Serialize)]
struct Args<'a> {
    op: u32,
    label: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    layer: Option<&'a str>,
    phase: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collective: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    protocol: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collective_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_member_arrived_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peer: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    direction: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pass: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    layer_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    work: Option<&'static str>,
}

#[derive(Serialize)]
struct Complete<'a, A: Serialize> {
    name: &'a str,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u16,
    args: A,
}

#[derive(Serialize)]
struct Flow {
    name: &'static str,
    cat: &'static str,
    ph: &'static str,
    id: u32,
    ts: f64,
    pid: u32,
    tid: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    bp: Option<&'static str>,
}

#[derive(Serialize)]
struct Metadata<A: Serialize> {
    name: &'static str,
    ph: &'static str,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u16>,
    args: A,
}

#[derive(Serialize)]
struct Counter<'a> {
    name: &'a str,
    ph: &'static str,
    ts: f64,
    pid: u32,
    args: OneArg,
}

/// A counter event's `args`: one value under its key.
struct OneArg {
    key: &'static str,
    value: f64,
}

impl Serialize for OneArg {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.key, &self.value)?;
        map.end()
    }
}

#[derive(Serialize)]
struct NameArg<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct SortArg {
    sort_index: u64,
}

/// Picoseconds to Chrome-trace microseconds.
fn micros(time: SimTime) -> f64 {
    time.as_ps() as f64 / 1e6
}

/// Writes events separated by commas.
struct EventWriter<W: Write> {
    out: W,
    first: bool,
    count: u64,
}

impl<W: Write> EventWriter<W> {
    fn event(&mut self, event: &impl Serialize) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.count += 1;
        serde_json::to_writer(&mut self.out, event).map_err(io::Error::other)
    }
}

impl<'a> ChromeTrace<'a> {
    /// The timeline of `graph` as run.
    pub fn new(graph: &'a ExecGraph, timeline: &'a Timeline) -> Self {
        ChromeTrace {
            graph,
            timeline,
            stream_name: None,
            process_name: None,
            spans: &[],
            counters: &[],
            counter_process: "counters",
        }
    }

    /// Adds `counters` as counter tracks of one process after the ranks.
    pub fn with_counters(mut self, counters: &'a [CounterTrack]) -> Self {
        self.counters = counters;
        self
    }

    /// Names the process of the counter tracks (default: "counters").
    pub fn with_counter_process(mut self, name: &'a str) -> Self {
        self.counter_process = name;
        self
    }

    /// Names each rank's process with `namer` (default: "rank N").
    pub fn with_process_names(mut self, namer: ProcessNamer<'a>) -> Self {
        self.process_name = Some(namer);
        self
    }

    /// Draws `spans` around the ops they cover.
    pub fn with_spans(mut self, spans: &'a [Span]) -> Self {
        self.spans = spans;
        self
    }

    /// Names each (rank, stream) track with `namer` (default: "stream N").
    pub fn with_stream_names(mut self, namer: StreamNamer<'a>) -> Self {
        self.stream_name = Some(namer);
        self
    }

    /// Writes the JSON object (`{"traceEvents": [...], ...}`) to `out`.
    pub fn write(&self, out: impl Write) -> io::Result<ExportStats> {
        let graph = self.graph;
        let timeline = self.timeline;
        if timeline.start.len() != graph.op_count() || timeline.end.len() != graph.op_count() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the timeline has {} ops but the graph {}: they are not from the same run",
                    timeline.start.len(),
                    graph.op_count()
                ),
            ));
        }
        let mut out = io::BufWriter::new(out);
        out.write_all(b"{\"displayTimeUnit\": \"ns\", \"otherData\": {\"generator\": \"parasim\"},\n\"traceEvents\": [\n")?;
        let mut writer = EventWriter { out, first: true, count: 0 };
        let mut stats = ExportStats::default();

        // Track names: processes are ranks, threads are the streams each rank uses.
        let streams = usize::from(graph.streams_per_rank());
        let mut used = vec![false; graph.ranks() as usize * streams];
        for op in graph.ops() {
            used[op.rank.0 as usize * streams + usize::from(op.stream.0)] = true;
        }
        for rank in 0..graph.ranks() {
            // Ranks without ops (folded by symmetry) get no track.
            if !used[rank as usize * streams..(rank as usize + 1) * streams].iter().any(|&u| u) {
                continue;
            }
            let name = match self.process_name {
                Some(namer) => namer(RankId(rank)),
                None => format!("rank {rank}"),
            };
            writer.event(&Metadata {
                name: "process_name",
                ph: "M",
                pid: rank,
                tid: None,
                args: NameArg { name: &name },
            })?;
            writer.event(&Metadata {
                name: "process_sort_index",
                ph: "M",
                pid: rank,
                tid: None,
                args: SortArg { sort_index: u64::from(rank) },
            })?;
            for stream in 0..streams {
                if !used[rank as usize * streams + stream] {
                    continue;
                }
                let stream = StreamId(stream as u16);
                let name = match self.stream_name {
                    Some(namer) => namer(RankId(rank), stream),
                    None => format!("stream {}", stream.0),
                };
                writer.event(&Metadata {
                    name: "thread_name",
                    ph: "M",
                    pid: rank,
                    tid: Some(stream.0),
                    args: NameArg { name: &name },
                })?;
                writer.event(&Metadata {
                    name: "thread_sort_index",
                    ph: "M",
                    pid: rank,
                    tid: Some(stream.0),
                    args: SortArg { sort_index: u64::from(stream.0) },
                })?;
            }
        }

        for span in self.spans {
            let (Some(&start), Some(&end)) =
                (timeline.start.get(span.first.0 as usize), timeline.end.get(span.last.0 as usize))
            else {
                continue;
            };
            writer.event(&Complete {
                name: &span.name,
                cat: "span",
                ph: "X",
                ts: micros(start),
                dur: micros(end) - micros(start),
                pid: span.rank.0,
                tid: span.stream.0,
                args: NameArg { name: &span.name },
            })?;
        }
        for (index, op) in graph.ops().iter().enumerate() {
            let id = OpId(index as u32);
            let start = timeline.start[index];
            let end = timeline.end[index];
            let label = graph.label(op.label);
            let (layer, phase) = layer_and_phase(graph, op);
            let meta = op.meta;
            let mut args = Args {
                op: id.0,
                label,
                layer,
                phase: phase.unwrap_or("compute"),
                bytes: None,
                collective: None,
                algorithm: None,
                protocol: None,
                collective_id: None,
                group_size: None,
                last_member_arrived_us: None,
                peer: None,
                direction: None,
                pass: meta.pass().map(Pass::name),
                layer_index: meta.layer(),
                group: meta.group().map(|group| group.name()),
                policy: graph.origin_name(meta.origin()),
                work: (meta.work() != Work::Device).then(|| meta.work().name()),
            };
            let category = match op.kind {
                OpKind::Compute { .. } => "compute",
                OpKind::Transfer { dst, bytes } => {
                    args.phase = phase.unwrap_or("communication");
                    args.bytes = Some(bytes.0);
                    args.peer = Some(dst.0);
                    "transfer"
                }
                OpKind::Memcpy { direction, bytes } => {
                    args.phase = phase.unwrap_or("copy");
                    args.bytes = Some(bytes.0);
                    args.direction = Some(match direction {
                        MemcpyDirection::HostToDevice => "host-to-device",
                        MemcpyDirection::DeviceToHost => "device-to-host",
                    });
                    "memcpy"
                }
                OpKind::Collective(collective) => {
                    let spec = graph.collective(collective);
                    args.phase = phase.unwrap_or("communication");
                    args.bytes = Some(spec.bytes.0);
                    args.collective = Some(spec.kind.name());
                    // What ran it: the network model's resolution of `auto` (NCCL's tuner),
                    // else the algorithm the graph asked for.
                    let choice = timeline.collective_choice.get(collective.0 as usize).copied().flatten();
                    args.algorithm = Some(choice.map_or(spec.algorithm.name(), |c| c.algorithm.name()));
                    args.protocol = choice.and_then(|c| c.protocol).map(|p| p.name());
                    args.collective_id = Some(collective.0);
                    args.group_size = Some(graph.group(spec.group).len());
                    let began =
                        timeline.collective_begin.get(collective.0 as usize).copied().unwrap_or(start);
                    args.last_member_arrived_us = Some(micros(began));
                    "collective"
                }
            };
            writer.event(&Complete {
                name: label,
                cat: category,
                ph: "X",
                ts: micros(start),
                dur: micros(end) - micros(start),
                pid: op.rank.0,
                tid: op.stream.0,
                args,
            })?;
            stats.ops += 1;
            if let OpKind::Collective(collective) = op.kind {
                let began = timeline.collective_begin.get(collective.0 as usize).copied().unwrap_or(start);
                if began > start && began <= end {
                    writer.event(&Complete {
                        name: "wait for peers",
                        cat: "collective-wait",
                        ph: "X",
                        ts: micros(start),
                        dur: micros(began) - micros(start),
                        pid: op.rank.0,
                        tid: op.stream.0,
                        args: NameArg { name: label },
                    })?;
                }
            }
            if let OpKind::Transfer { dst, .. } = op.kind {
                // The arrow ends at the first op on the receiver that waits for the data.
                let receiver = graph
                    .dependents(id)
                    .iter()
                    .copied()
                    .filter(|&d| graph.op(d).rank == dst)
                    .min_by_key(|&d| (timeline.start[d.0 as usize], d));
                match receiver {
                    Some(receiver) => {
                        let flow = |ph, ts, pid, tid, bp| Flow {
                            name: "transfer",
                            cat: "transfer",
                            ph,
                            id: id.0,
                            ts,
                            pid,
                            tid,
                            bp,
                        };
                        writer.event(&flow("s", micros(start), op.rank.0, op.stream.0, None))?;
                        let target = graph.op(receiver);
                        writer.event(&flow(
                            "f",
                            micros(timeline.start[receiver.0 as usize]),
                            target.rank.0,
                            target.stream.0,
                            Some("e"),
                        ))?;
                        stats.flows += 1;
                    }
                    None => stats.transfers_without_receiver += 1,
                }
            }
        }
        if !self.counters.is_empty() {
            let pid = graph.ranks();
            writer.event(&Metadata {
                name: "process_name",
                ph: "M",
                pid,
                tid: None,
                args: NameArg { name: self.counter_process },
            })?;
            writer.event(&Metadata {
                name: "process_sort_index",
                ph: "M",
                pid,
                tid: None,
                args: SortArg { sort_index: u64::from(pid) },
            })?;
        }
        for track in self.counters {
            for &(time, value) in &track.points {
                writer.event(&Counter {
                    name: &track.name,
                    ph: "C",
                    ts: micros(time),
                    pid: graph.ranks(),
                    args: OneArg { key: track.key, value },
                })?;
                stats.counter_points += 1;
            }
        }
        stats.events = writer.count;
        let mut out = writer.out;
        out.write_all(b"\n]}\n")?;
        out.flush()?;
        Ok(stats)
    }
}

/// The `layer` and `phase` of a layer's kernel (`"conv1"`, `"backward-data"`) or of the
/// optimizer step (`"optimizer"`, `"step"`), from the op's metadata; `None` for every other op
/// (a collective or copy of a layer, a launch, an op without metadata).
fn layer_and_phase<'g>(graph: &'g ExecGraph, op: &Op) -> (Option<&'g str>, Option<&'static str>) {
    if !matches!(op.kind, OpKind::Compute { .. }) || op.meta.work() != Work::Device {
        return (None, None);
    }
    match op.meta.pass() {
        Some(pass @ (Pass::Forward | Pass::BackwardData | Pass::BackwardWeight)) => {
            match op.meta.layer().and_then(|layer| graph.layer_name(layer)).filter(|name| !name.is_empty()) {
                Some(name) => (Some(name), Some(pass.name())),
                None => (None, None),
            }
        }
        Some(Pass::Optimizer) => (Some("optimizer"), Some("step")),
        _ => (None, None),
    }
}
