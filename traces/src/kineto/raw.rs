//! Streaming parse of one Kineto JSON file into compact records.
//!
//! The file is read through a `BufReader` (and a gzip decoder when it starts with the gzip
//! magic number) by `serde_json::Deserializer::from_reader`; a visitor walks the top-level
//! object and hands each element of `traceEvents` to [`Collector::push`] as soon as it is
//! parsed, so the document is never held in memory. Only the events a replay needs are kept,
//! as small fixed-size records with interned names; everything else is counted.

use sim_core::lookup::LookupMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::lenient::{
    LenientList, LenientNumber, LenientString, Number, ObjectOr, RankList, first_tensor_elements, sizes,
};
use crate::error::TraceError;
use crate::meter::{Meter, Metered};
use crate::model::{CollectiveType, NameId};
use crate::nccl;
use crate::warnings::Warnings;

/// Interns names so each distinct kernel or call name is stored once.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    pub(crate) names: Vec<String>,
    ids: LookupMap<String, NameId>,
}

impl Interner {
    /// The id of `name`, adding it if new.
    pub(crate) fn intern(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as NameId;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }
}

/// Collective arguments as newer PyTorch writes them on NCCL kernels and
/// `record_param_comms` (`Collective name`, `In msg nelems`, ...).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CommsArgs {
    pub(crate) collective: Option<String>,
    pub(crate) in_elements: Option<u64>,
    pub(crate) out_elements: Option<u64>,
    pub(crate) dtype: Option<String>,
    pub(crate) group_size: Option<u64>,
    pub(crate) group_ranks: Option<Vec<u32>>,
    /// First input tensor's elements (`Input Dims`), older traces.
    pub(crate) input_elements: Option<u64>,
    /// First input's type (`Input type`), older traces.
    pub(crate) input_type: Option<String>,
}

impl CommsArgs {
    fn is_empty(&self) -> bool {
        *self == CommsArgs::default()
    }
}

/// Which GPU activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GpuCategory {
    Kernel,
    Memcpy,
    Memset,
}

/// A kernel, copy or memset.
#[derive(Debug, Clone)]
pub(crate) struct RawGpu {
    pub(crate) category: GpuCategory,
    pub(crate) device: u32,
    pub(crate) stream: u64,
    pub(crate) ts_ns: i64,
    pub(crate) duration_ns: u64,
    pub(crate) name: NameId,
    pub(crate) correlation: Option<u64>,
    pub(crate) external_id: Option<u64>,
    pub(crate) bytes: Option<u64>,
    /// Thread blocks a kernel launched (the product of its recorded `grid`), if recorded.
    pub(crate) blocks: Option<u64>,
    /// Collective arguments on NCCL kernels (newer PyTorch), boxed: most ops have none.
    pub(crate) comms: Option<Box<CommsArgs>>,
}

/// A CUDA runtime (or driver) call.
#[derive(Debug, Clone)]
pub(crate) struct RawCall {
    pub(crate) thread: u64,
    pub(crate) ts_ns: i64,
    pub(crate) duration_ns: u64,
    pub(crate) name: NameId,
    pub(crate) correlation: Option<u64>,
}

/// What a host annotation marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnnotationKind {
    /// `record_param_comms`.
    Comms,
    /// `nccl:<collective>`.
    Nccl(Option<CollectiveType>),
    /// `ProfilerStep#N`.
    Step(u64),
}

/// A host-side annotation that matters: collective issue or iteration boundary.
#[derive(Debug, Clone)]
pub(crate) struct RawAnnotation {
    pub(crate) kind: AnnotationKind,
    pub(crate) thread: u64,
    pub(crate) ts_ns: i64,
    pub(crate) duration_ns: u64,
    pub(crate) external_id: Option<u64>,
    pub(crate) comms: Option<Box<CommsArgs>>,
}

/// A host operator (`cpu_op`) with the shapes and types of its arguments, kept only when the
/// caller asks for operators (calibration): replay does not need them.
#[derive(Debug, Clone)]
pub(crate) struct RawOperator {
    pub(crate) name: NameId,
    pub(crate) thread: u64,
    pub(crate) ts_ns: i64,
    pub(crate) duration_ns: u64,
    /// Its `Input Dims` and `Input type`: an index into [`RawFile::arguments`].
    pub(crate) arguments: u32,
}

/// The `Input Dims` and `Input type` of an operator's arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Arguments {
    /// `Input Dims`, one entry per argument (see [`sizes`]); empty if not recorded.
    pub(crate) dims: Vec<Option<Vec<u64>>>,
    /// `Input type`, one entry per argument; empty if not recorded.
    pub(crate) types: Vec<Option<String>>,
}

/// Argument lists stored once each: a long trace repeats the same few hundred operator
/// signatures in every iteration, so its operators cost a fixed-size record each, not their
/// argument lists.
#[derive(Debug, Default)]
pub(crate) struct ArgumentLists {
    pub(crate) lists: Vec<Arguments>,
    ids: LookupMap<Arguments, u32>,
}

impl ArgumentLists {
    /// The index of `arguments`, adding them if new.
    fn intern(&mut self, arguments: Arguments) -> u32 {
        if let Some(&id) = self.ids.get(&arguments) {
            return id;
        }
        let id = self.lists.len() as u32;
        self.lists.push(arguments.clone());
        self.ids.insert(arguments, id);
        id
    }
}

/// A Kineto `cuda_sync` event: a stream waited on an event recorded on another stream.
#[derive(Debug, Clone)]
pub(crate) struct RawStreamSync {
    pub(crate) device: u32,
    pub(crate) stream: u64,
    pub(crate) ts_ns: i64,
    pub(crate) wait_on_stream: Option<u64>,
    pub(crate) record_correlation: Option<u64>,
}

/// One `deviceProperties` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RawDevice {
    #[serde(default)]
    pub(crate) id: LenientNumber,
    #[serde(default)]
    pub(crate) name: LenientString,
    #[serde(default, rename = "totalGlobalMem")]
    pub(crate) total_global_mem: LenientNumber,
    #[serde(default, rename = "numSms")]
    pub(crate) num_sms: LenientNumber,
    #[serde(default, rename = "computeMajor")]
    pub(crate) compute_major: LenientNumber,
    #[serde(default, rename = "computeMinor")]
    pub(crate) compute_minor: LenientNumber,
}

/// `distributedInfo`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RawDistributed {
    #[serde(default)]
    pub(crate) rank: LenientNumber,
    #[serde(default)]
    pub(crate) world_size: LenientNumber,
}

/// Everything kept from one file.
#[derive(Debug, Default)]
pub(crate) struct RawFile {
    pub(crate) path: PathBuf,
    pub(crate) distributed: Option<RawDistributed>,
    pub(crate) devices: Vec<RawDevice>,
    pub(crate) base_time_ns: Option<i64>,
    pub(crate) gpu: Vec<RawGpu>,
    pub(crate) calls: Vec<RawCall>,
    pub(crate) annotations: Vec<RawAnnotation>,
    /// Host operators with their argument shapes, when asked for.
    pub(crate) operators: Vec<RawOperator>,
    /// The operators' distinct argument lists ([`RawOperator::arguments`]).
    pub(crate) arguments: ArgumentLists,
    pub(crate) stream_syncs: Vec<RawStreamSync>,
    /// Exact stream waits as parasim writes them (`parasimStreamWaits`: `[op, after]` pairs
    /// of GPU op positions in (stream, start) order).
    pub(crate) stream_waits: Vec<(u32, u32)>,
    /// Events read from `traceEvents`.
    pub(crate) events: u64,
    pub(crate) warnings: Warnings,
}

/// The fields of an event that replay reads; every other key is skipped unparsed.
#[derive(Debug, Default, Deserialize)]
struct RawEvent {
    #[serde(default)]
    ph: LenientString,
    #[serde(default)]
    cat: LenientString,
    #[serde(default)]
    name: LenientString,
    #[serde(default)]
    pid: LenientNumber,
    #[serde(default)]
    tid: LenientNumber,
    #[serde(default)]
    ts: LenientNumber,
    #[serde(default)]
    dur: LenientNumber,
    #[serde(default)]
    args: ObjectOr<RawArgs>,
}

#[derive(Debug, Default, Deserialize)]
struct RawArgs {
    #[serde(default)]
    correlation: LenientNumber,
    #[serde(default, rename = "External id")]
    external_id: LenientNumber,
    #[serde(default)]
    device: LenientNumber,
    #[serde(default)]
    stream: LenientNumber,
    #[serde(default)]
    bytes: LenientNumber,
    /// A kernel's launch grid, `[x, y, z]` thread blocks.
    #[serde(default)]
    grid: LenientList<LenientNumber>,
    #[serde(default, rename = "Collective name")]
    collective: LenientString,
    #[serde(default, rename = "In msg nelems")]
    in_elements: LenientNumber,
    #[serde(default, rename = "Out msg nelems")]
    out_elements: LenientNumber,
    #[serde(default)]
    dtype: LenientString,
    #[serde(default, rename = "Group size")]
    group_size: LenientNumber,
    #[serde(default, rename = "Process Group Ranks")]
    group_ranks: RankList,
    #[serde(default, rename = "Input Dims")]
    input_dims: LenientList<LenientList<LenientNumber>>,
    #[serde(default, rename = "Input type")]
    input_type: LenientList<LenientString>,
    #[serde(default)]
    wait_on_stream: LenientNumber,
    #[serde(default)]
    wait_on_cuda_event_record_corr_id: LenientNumber,
}

impl RawArgs {
    fn comms(&mut self) -> CommsArgs {
        CommsArgs {
            collective: self.collective.0.take(),
            in_elements: self.in_elements.0.and_then(Number::as_u64),
            out_elements: self.out_elements.0.and_then(Number::as_u64),
            dtype: self.dtype.0.take(),
            group_size: self.group_size.0.and_then(Number::as_u64),
            group_ranks: self.group_ranks.0.take(),
            input_elements: first_tensor_elements(&self.input_dims),
            input_type: self
                .input_type
                .0
                .as_mut()
                .and_then(|types| types.first_mut())
                .and_then(|t| t.0.take()),
        }
    }
}

/// The thread blocks of a recorded launch grid: the product of its dimensions, `None` unless
/// every dimension is a non-negative integer.
fn grid_blocks(grid: &LenientList<LenientNumber>) -> Option<u64> {
    let dims = grid.0.as_ref().filter(|dims| !dims.is_empty())?;
    dims.iter().try_fold(1u64, |blocks, dim| blocks.checked_mul(dim.0.and_then(Number::as_u64)?))
}

/// Categories that carry nothing a replay uses; skipped without a warning.
const SKIPPED_CATEGORIES: &[&str] = &[
    "ac2g",
    "async_cpu_to_gpu",
    "fwdbwd",
    "cpu_instant_event",
    "Trace",
    "python_function",
    "gpu_user_annotation",
    "overhead",
    "cuda_profiler_range",
    "Operator",
    "Python",
];

/// Receives events as they are parsed.
struct Collector<'a> {
    file: &'a mut RawFile,
    names: &'a mut Interner,
    keep_operators: bool,
    meter: &'a Meter<'a>,
}

impl Collector<'_> {
    fn push(&mut self, mut event: RawEvent) {
        self.file.events += 1;
        self.meter.event();
        let Some(category) = event.cat.0.take() else {
            // Metadata ("M"), instant and other category-less events label tracks; nothing
            // to replay.
            return;
        };
        let warnings = &mut self.file.warnings;
        match category.as_str() {
            "kernel" | "Kernel" => self.push_gpu(GpuCategory::Kernel, event),
            "gpu_memcpy" | "Memcpy" => self.push_gpu(GpuCategory::Memcpy, event),
            "gpu_memset" | "Memset" => self.push_gpu(GpuCategory::Memset, event),
            "cuda_runtime" | "Runtime" | "cuda_driver" | "Driver" => self.push_call(event),
            "cpu_op" | "Operator" if self.keep_operators => {
                self.push_operator(&event);
                if category == "cpu_op" {
                    self.push_annotation(event);
                }
            }
            "cpu_op" | "user_annotation" => self.push_annotation(event),
            "cuda_sync" => self.push_stream_sync(event),
            other if SKIPPED_CATEGORIES.contains(&other) => {}
            other => warnings.add(format!("events of category `{other}` ignored (replay does not use them)")),
        }
    }

    /// `ts` and `dur` in nanoseconds, or a counted warning.
    fn times(&mut self, event: &RawEvent, what: &str) -> Option<(i64, u64)> {
        if event.ph.0.as_deref().is_some_and(|ph| ph != "X") {
            self.file.warnings.add(format!("{what} events that are not complete (\"X\") events skipped"));
            return None;
        }
        let ts = event.ts.0.and_then(Number::micros_to_nanos);
        let dur = event.dur.0.and_then(Number::micros_to_nanos).and_then(|d| u64::try_from(d).ok());
        match (ts, dur) {
            (Some(ts), Some(dur)) => Some((ts, dur)),
            _ => {
                self.file.warnings.add(format!("{what} events without a valid `ts` and `dur` skipped"));
                None
            }
        }
    }

    fn push_gpu(&mut self, category: GpuCategory, mut event: RawEvent) {
        let what = match category {
            GpuCategory::Kernel => "kernel",
            GpuCategory::Memcpy => "gpu_memcpy",
            GpuCategory::Memset => "gpu_memset",
        };
        let Some((ts_ns, duration_ns)) = self.times(&event, what) else { return };
        let mut args = event.args.0.take().unwrap_or_default();
        let device =
            args.device.0.or(event.pid.0).and_then(Number::as_u64).and_then(|d| u32::try_from(d).ok());
        let stream = args.stream.0.or(event.tid.0).and_then(Number::as_u64);
        let (Some(device), Some(stream)) = (device, stream) else {
            self.file.warnings.add(format!("{what} events without a device and stream skipped"));
            return;
        };
        let name = event.name.0.take().unwrap_or_default();
        let comms = if category == GpuCategory::Kernel && nccl::is_nccl_kernel(&name) {
            let comms = args.comms();
            (!comms.is_empty()).then(|| Box::new(comms))
        } else {
            None
        };
        self.file.gpu.push(RawGpu {
            category,
            device,
            stream,
            ts_ns,
            duration_ns,
            name: self.names.intern(&name),
            correlation: args.correlation.0.and_then(Number::as_u64),
            external_id: args.external_id.0.and_then(Number::as_u64),
            bytes: args.bytes.0.and_then(Number::as_u64),
            blocks: grid_blocks(&args.grid),
            comms,
        });
    }

    fn push_call(&mut self, mut event: RawEvent) {
        let Some((ts_ns, duration_ns)) = self.times(&event, "cuda_runtime") else { return };
        let Some(thread) = event.tid.0.and_then(Number::as_id) else {
            self.file.warnings.add("cuda_runtime events without a numeric thread id skipped");
            return;
        };
        let name = event.name.0.take().unwrap_or_default();
        let correlation = event.args.0.as_ref().and_then(|args| args.correlation.0).and_then(Number::as_u64);
        self.file.calls.push(RawCall {
            thread,
            ts_ns,
            duration_ns,
            name: self.names.intern(&name),
            correlation,
        });
    }

    fn push_annotation(&mut self, mut event: RawEvent) {
        let Some(name) = event.name.0.as_deref() else { return };
        let kind = if name == "record_param_comms" {
            AnnotationKind::Comms
        } else if let Some(collective) = name.strip_prefix("nccl:") {
            AnnotationKind::Nccl(nccl::parse_collective_name(collective))
        } else if let Some(number) = name.strip_prefix("ProfilerStep#") {
            match number.trim().parse() {
                Ok(number) => AnnotationKind::Step(number),
                Err(_) => {
                    self.file.warnings.add("ProfilerStep annotations without a step number skipped");
                    return;
                }
            }
        } else {
            return;
        };
        let Some((ts_ns, duration_ns)) = self.times(&event, "annotation") else { return };
        let Some(thread) = event.tid.0.and_then(Number::as_id) else {
            self.file.warnings.add("annotations without a numeric thread id skipped");
            return;
        };
        let mut args = event.args.0.take().unwrap_or_default();
        let comms = match kind {
            AnnotationKind::Step(_) => None,
            _ => {
                let comms = args.comms();
                (!comms.is_empty()).then(|| Box::new(comms))
            }
        };
        self.file.annotations.push(RawAnnotation {
            kind,
            thread,
            ts_ns,
            duration_ns,
            external_id: args.external_id.0.and_then(Number::as_u64),
            comms,
        });
    }

    fn push_operator(&mut self, event: &RawEvent) {
        let Some(name) = event.name.0.as_deref() else { return };
        let Some((ts_ns, duration_ns)) = self.times(event, "cpu_op") else { return };
        let Some(thread) = event.tid.0.and_then(Number::as_id) else {
            self.file.warnings.add("cpu_op events without a numeric thread id skipped");
            return;
        };
        let args = event.args.0.as_ref();
        let dims = args
            .and_then(|a| a.input_dims.0.as_ref())
            .map_or_else(Vec::new, |list| list.iter().map(sizes).collect());
        let types = args
            .and_then(|a| a.input_type.0.as_ref())
            .map_or_else(Vec::new, |list| list.iter().map(|t| t.0.clone()).collect());
        let name = self.names.intern(name);
        let arguments = self.file.arguments.intern(Arguments { dims, types });
        self.file.operators.push(RawOperator { name, thread, ts_ns, duration_ns, arguments });
    }

    fn push_stream_sync(&mut self, mut event: RawEvent) {
        let ts = event.ts.0.and_then(Number::micros_to_nanos);
        let args = event.args.0.take().unwrap_or_default();
        let device =
            args.device.0.or(event.pid.0).and_then(Number::as_u64).and_then(|d| u32::try_from(d).ok());
        let stream = args.stream.0.or(event.tid.0).and_then(Number::as_u64);
        let (Some(ts_ns), Some(device), Some(stream)) = (ts, device, stream) else {
            self.file.warnings.add("cuda_sync events without time, device or stream skipped");
            return;
        };
        self.file.stream_syncs.push(RawStreamSync {
            device,
            stream,
            ts_ns,
            wait_on_stream: args.wait_on_stream.0.and_then(Number::as_u64),
            record_correlation: args.wait_on_cuda_event_record_corr_id.0.and_then(Number::as_u64),
        });
    }
}

/// Where the parser was when an error struck, for the message.
#[derive(Debug, Clone, Default)]
struct Position {
    key: Option<String>,
}

/// Deserializes the `traceEvents` array element by element.
struct EventsSeed<'c, 'a> {
    collector: &'c mut Collector<'a>,
}

impl<'de> DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(ObjectOr(event)) = seq.next_element::<ObjectOr<RawEvent>>()? {
            match event {
                Some(event) => self.collector.push(event),
                None => {
                    self.collector.file.events += 1;
                    self.collector.meter.event();
                    self.collector.file.warnings.add("trace events that are not JSON objects skipped");
                }
            }
        }
        Ok(())
    }
}

/// Deserializes the top level: an object with `traceEvents` (Kineto) or a bare array of
/// events (plain Chrome trace).
struct DocumentSeed<'c, 'a> {
    collector: &'c mut Collector<'a>,
    position: &'c mut Position,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Chrome trace: an object with `traceEvents` or an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.position.key = Some("traceEvents".into());
        EventsSeed { collector: self.collector }.visit_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            self.position.key = Some(key.clone());
            match key.as_str() {
                "traceEvents" => map.next_value_seed(EventsSeed { collector: &mut *self.collector })?,
                "deviceProperties" => {
                    let devices: Option<Vec<ObjectOr<RawDevice>>> = map.next_value()?;
                    self.collector.file.devices =
                        devices.unwrap_or_default().into_iter().filter_map(|d| d.0).collect();
                }
                "distributedInfo" => {
                    self.collector.file.distributed = map.next_value::<ObjectOr<RawDistributed>>()?.0;
                }
                "parasimStreamWaits" => {
                    let waits: Option<Vec<(u32, u32)>> = map.next_value()?;
                    self.collector.file.stream_waits = waits.unwrap_or_default();
                }
                "baseTimeNanoseconds" => {
                    let base: LenientNumber = map.next_value()?;
                    self.collector.file.base_time_ns =
                        base.0.and_then(Number::as_u64).and_then(|b| i64::try_from(b).ok());
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.position.key = None;
        Ok(())
    }
}

/// Opens `path`, transparently gunzipping it if it starts with the gzip magic number.
pub(crate) fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let file = fs_err::File::open(path).map_err(|e| TraceError::io(path, e))?;
    buffered(BufReader::with_capacity(1 << 16, file), path)
}

/// [`open`], counting the bytes read from the file on `meter`.
pub(crate) fn open_metered<'m>(
    path: &Path,
    meter: &'m Meter<'_>,
) -> Result<Box<dyn BufRead + 'm>, TraceError> {
    let file = fs_err::File::open(path).map_err(|e| TraceError::io(path, e))?;
    buffered(BufReader::with_capacity(1 << 16, Metered::new(file, meter)), path)
}

/// `reader`, gunzipped if it starts with the gzip magic number.
fn buffered<'r, R: Read + 'r>(
    mut reader: BufReader<R>,
    path: &Path,
) -> Result<Box<dyn BufRead + 'r>, TraceError> {
    let head = reader.fill_buf().map_err(|e| TraceError::io(path, e))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let decoder = flate2::bufread::MultiGzDecoder::new(reader);
        Ok(Box::new(BufReader::with_capacity(1 << 16, decoder)))
    } else {
        Ok(Box::new(reader))
    }
}

/// Parses one Kineto file; host operators are kept (with their argument shapes) only if
/// `keep_operators`.
pub(crate) fn parse_file(
    path: &Path,
    names: &mut Interner,
    keep_operators: bool,
) -> Result<RawFile, TraceError> {
    let meter = Meter::new(None);
    parse_file_metered(path, names, keep_operators, &meter)
}

/// [`parse_file`], counting the bytes read and the events parsed on `meter`.
pub(crate) fn parse_file_metered(
    path: &Path,
    names: &mut Interner,
    keep_operators: bool,
    meter: &Meter<'_>,
) -> Result<RawFile, TraceError> {
    let reader = open_metered(path, meter)?;
    parse_reader_metered(reader, path, names, keep_operators, meter)
}

/// Parses a Kineto document from `reader`; `path` names it in errors.
#[cfg(test)]
pub(crate) fn parse_reader(
    reader: impl Read,
    path: &Path,
    names: &mut Interner,
    keep_operators: bool,
) -> Result<RawFile, TraceError> {
    parse_reader_metered(reader, path, names, keep_operators, &Meter::new(None))
}

/// [`parse_reader`], counting the events parsed on `meter`.
fn parse_reader_metered(
    reader: impl Read,
    path: &Path,
    names: &mut Interner,
    keep_operators: bool,
    meter: &Meter<'_>,
) -> Result<RawFile, TraceError> {
    let mut file = RawFile { path: path.to_path_buf(), ..RawFile::default() };
    let mut position = Position::default();
    let result = {
        let mut collector = Collector { file: &mut file, names, keep_operators, meter };
        let mut deserializer = serde_json::Deserializer::from_reader(reader);
        DocumentSeed { collector: &mut collector, position: &mut position }
            .deserialize(&mut deserializer)
            .and_then(|()| deserializer.end())
    };
    if let Err(error) = result {
        // An I/O error inside the decoder (a truncated gzip stream) is an I/O error of the file.
        if error.is_io() {
            let source = std::io::Error::other(error.to_string());
            return Err(TraceError::io(path, source));
        }
        let context = match position.key.as_deref() {
            Some("traceEvents") => format!("event {} of `traceEvents`", file.events),
            Some(key) => format!("key `{key}`"),
            None => "top level".to_string(),
        };
        return Err(TraceError::Json { path: path.to_path_buf(), context, message: error.to_string() });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RawFile, TraceError> {
        parse_reader(text.as_bytes(), Path::new("test.json"), &mut Interner::default(), false)
    }

    #[test]
    fn keeps_what_replay_needs_and_counts_the_rest() {
        let file = parse(
            r#"{"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 8},
                "traceEvents": [
                  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2,
                   "args": {"correlation": 5, "stream": 7, "device": 0, "grid": [1, 1, 1]}},
                  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 9,
                   "ts": 9, "dur": 1, "args": {"correlation": 5}},
                  {"ph": "X", "cat": "mystery", "name": "m", "ts": 1, "dur": 1},
                  {"ph": "X", "cat": "mystery", "name": "m", "ts": 1, "dur": 1},
                  {"ph": "X", "cat": "kernel", "name": "bad", "ts": "soon", "dur": 1},
                  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "tid": 9, "ts": 5, "dur": 20},
                  {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "x"}}
                ]}"#,
        )
        .unwrap();
        assert_eq!(file.events, 7);
        assert_eq!(file.gpu.len(), 1);
        assert_eq!(file.gpu[0].ts_ns, 10_500);
        assert_eq!(file.calls.len(), 1);
        assert_eq!(file.annotations.len(), 1);
        assert_eq!(file.warnings.count("events of category `mystery` ignored (replay does not use them)"), 2);
        assert_eq!(file.warnings.count("kernel events without a valid `ts` and `dur` skipped"), 1);
        assert_eq!(file.distributed.unwrap().rank.0, Some(Number::Unsigned(3)));
    }

    #[test]
    fn malformed_json_names_the_event() {
        let error = parse(r#"{"traceEvents": [{"ph": "X"}, {"ph": "X", "#).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("test.json") && message.contains("event 1"), "{message}");
        let error = parse(r#"{"deviceProperties": 5}"#).unwrap_err().to_string();
        assert!(error.contains("key `deviceProperties`"), "{error}");
    }

    #[test]
    fn bare_array_is_accepted() {
        let file =
            parse(r#"[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]"#)
                .unwrap();
        assert_eq!(file.gpu.len(), 1);
    }
}
