//! The sweep's output files (docs/sweep.md): CSV or JSON Lines, a header that names the sweep,
//! then one line per configuration in configuration order.
//!
//! CSV starts with a comment line `# parasim sweep: configurations=N fingerprint=HEX
//! [shard=I/N] file=NAME` (pandas: `read_csv(path, comment="#")`), then the column names.
//! JSON Lines starts with `{"parasim_sweep": {...}}` holding the same and the columns. A row
//! never spans lines (error messages are joined onto one), so a file cut short ends in at most
//! one partial line, which [`read_existing`] reports and a resumed run cuts off.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Row;

/// FNV-1a, 64 bits: a fingerprint stable across machines and Rust versions.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl Format {
    /// The format a file name asks for: `.jsonl` / `.ndjson` JSON Lines, `.csv` CSV.
    pub fn of_name(name: &str) -> Option<Format> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".jsonl") || lower.ends_with(".ndjson") {
            Some(Format::Jsonl)
        } else if lower.ends_with(".csv") {
            Some(Format::Csv)
        } else {
            None
        }
    }

    /// The format of a file's text, from its first byte.
    pub fn of_text(text: &str) -> Format {
        if text.starts_with('{') { Format::Jsonl } else { Format::Csv }
    }
}

/// One of N deterministic slices of a sweep: configuration `i` belongs to shard `i mod N`
/// (interleaved, so every shard gets a share of the large and the small configurations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, `0..count`.
    pub index: u64,
    /// How many shards.
    pub count: u64,
}

impl Shard {
    /// `I/N`, 0-based.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let (index, count) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?}: write I/N, e.g. 0/4 (shards are numbered from 0)"))?;
        let index: u64 =
            index.trim().parse().map_err(|_| format!("{text:?}: {index:?} is not a shard number"))?;
        let count: u64 =
            count.trim().parse().map_err(|_| format!("{text:?}: {count:?} is not a shard count"))?;
        Shard::new(index, count).map_err(|message| format!("{text:?}: {message}"))
    }

    /// Shard `index` of `count`.
    pub fn new(index: u64, count: u64) -> Result<Shard, String> {
        if count == 0 {
            return Err("the shard count must be at least 1".into());
        }
        if index >= count {
            return Err(format!("shard {index} of {count}: shards are numbered 0 to {}", count - 1));
        }
        Ok(Shard { index, count })
    }

    /// Whether configuration `i` is in this shard.
    pub fn contains(self, i: u64) -> bool {
        i % self.count == self.index
    }

    /// This shard's configurations of a sweep of `total`, in order.
    pub fn indices(self, total: u64) -> impl Iterator<Item = u64> {
        (self.index..total).step_by(usize::try_from(self.count).unwrap_or(usize::MAX))
    }
}

/// What names a sweep's output: it must match for a resume to append and for shards to merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The sweep file's name (no folder, so shards run from anywhere agree).
    pub file: String,
    /// Configurations in the whole sweep.
    pub configurations: u64,
    /// [`super::Sweep::fingerprint`].
    pub fingerprint: u64,
    /// The slice this file holds; `None` for all of it.
    pub shard: Option<Shard>,
    /// The columns.
    pub columns: Vec<String>,
}

impl Header {
    /// The header lines of `format`, each ending in a newline.
    pub fn text(&self, format: Format) -> String {
        match format {
            Format::Csv => {
                let mut text = format!(
                    "# parasim sweep: configurations={} fingerprint={:016x}",
                    self.configurations, self.fingerprint
                );
                if let Some(shard) = self.shard {
                    let _ = write!(text, " shard={}/{}", shard.index, shard.count);
                }
                let _ = writeln!(text, " file={}", self.file);
                text + &crate::csv_text::line(&self.columns)
            }
            Format::Jsonl => {
                let meta = serde_json::json!({ "parasim_sweep": {
                    "file": self.file,
                    "configurations": self.configurations,
                    "fingerprint": format!("{:016x}", self.fingerprint),
                    "shard": self.shard.map(|s| format!("{}/{}", s.index, s.count)),
                    "columns": self.columns,
                }});
                format!("{meta}\n")
            }
        }
    }

    /// Reads the header at the start of `text`: the header and its length in bytes.
    pub fn parse(text: &str) -> Result<(Header, usize), String> {
        let first_end = text.find('\n').ok_or("the file has no complete header line")?;
        let first = &text[..first_end];
        match Format::of_text(text) {
            Format::Jsonl => {
                let value: serde_json::Value = serde_json::from_str(first)
                    .map_err(|e| format!("the first line is not a sweep header: {e}"))?;
                let meta =
                    value.get("parasim_sweep").ok_or("the first line is not a parasim sweep header")?;
                let field = |name: &str| meta.get(name).ok_or(format!("the header has no `{name}`"));
                let header = Header {
                    file: field("file")?.as_str().unwrap_or_default().to_string(),
                    configurations: field("configurations")?.as_u64().ok_or("bad `configurations`")?,
                    fingerprint: u64::from_str_radix(field("fingerprint")?.as_str().unwrap_or_default(), 16)
                        .map_err(|_| "bad `fingerprint`")?,
                    shard: match meta.get("shard").and_then(|s| s.as_str()) {
                        Some(shard) => Some(Shard::parse(shard)?),
                        None => None,
                    },
                    columns: serde_json::from_value(field("columns")?.clone())
                        .map_err(|e| format!("bad `columns`: {e}"))?,
                };
                Ok((header, first_end + 1))
            }
            Format::Csv => {
                let rest = first
                    .strip_prefix("# parasim sweep: ")
                    .ok_or("the first line is not a parasim sweep header")?;
                let (fields, file) = rest.split_once(" file=").ok_or("the header has no file=")?;
                let mut configurations = None;
                let mut fingerprint = None;
                let mut shard = None;
                for field in fields.split_whitespace() {
                    match field.split_once('=') {
                        Some(("configurations", n)) => configurations = n.parse().ok(),
                        Some(("fingerprint", hex)) => fingerprint = u64::from_str_radix(hex, 16).ok(),
                        Some(("shard", s)) => shard = Some(Shard::parse(s)?),
                        _ => return Err(format!("unexpected {field:?} in the header")),
                    }
                }
                let second_end =
                    text[first_end + 1..].find('\n').ok_or("the file has no complete column line")?
                        + first_end
                        + 1;
                let columns = crate::csv_text::records(&text[first_end + 1..second_end])?
                    .into_iter()
                    .next()
                    .map(|(_, columns)| columns)
                    .ok_or("the column line is empty")?;
                let header = Header {
                    file: file.to_string(),
                    configurations: configurations.ok_or("the header has no configurations=")?,
                    fingerprint: fingerprint.ok_or("the header has no fingerprint=")?,
                    shard,
                    columns,
                };
                Ok((header, second_end + 1))
            }
        }
    }
}

/// One row as a line of `format`, ending in a newline; `columns` are the header's.
pub fn encode_row(format: Format, columns: &[String], row: &Row) -> String {
    let cells = std::iter::once(serde_json::Value::from(row.index))
        .chain(row.values.iter().cloned())
        .chain(row.metrics.iter().cloned())
        .chain([row.status.name().into(), row.error.clone().into()]);
    match format {
        Format::Csv => {
            let fields: Vec<String> = cells.map(|cell| csv_field(&cell)).collect();
            crate::csv_text::line(&fields)
        }
        Format::Jsonl => {
            let mut line = String::from("{");
            for (i, (column, cell)) in columns.iter().zip(cells).enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{}:{}", serde_json::Value::from(column.as_str()), cell);
            }
            line + "}\n"
        }
    }
}

/// A cell's CSV text: empty for null, a string as it is, anything else as JSON.
fn csv_field(cell: &serde_json::Value) -> String {
    match cell {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The configuration number a row line starts with.
fn row_index(line: &str) -> Option<u64> {
    let digits = line.strip_prefix("{\"index\":").unwrap_or(line);
    // A CSV line with a `#` in a field has every field quoted.
    let digits = digits.strip_prefix('"').unwrap_or(digits);
    let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// What a column of the output holds: what `--resume` checks each kept row's cells against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The configuration number: a whole number.
    Index,
    /// A number (or empty: the configuration did not report it).
    Number,
    /// Text (or empty).
    Text,
    /// `true` or `false` (or empty).
    Boolean,
    /// One of the status names (`ok`, `failed`, `skipped`, `does-not-fit`).
    Status,
    /// Anything: a swept value.
    Any,
}

impl Kind {
    /// The kind of a metric whose value in a full summary is `value`.
    pub fn of(value: &serde_json::Value) -> Kind {
        match value {
            serde_json::Value::Number(_) => Kind::Number,
            serde_json::Value::String(_) => Kind::Text,
            serde_json::Value::Bool(_) => Kind::Boolean,
            _ => Kind::Any,
        }
    }

    /// The kinds of a header's columns: the index, `swept` values, then `metrics`, status and
    /// error.
    pub fn columns(swept: usize, metrics: impl IntoIterator<Item = Kind>) -> Vec<Kind> {
        let mut kinds = vec![Kind::Index];
        kinds.extend(std::iter::repeat_n(Kind::Any, swept));
        kinds.extend(metrics);
        kinds.extend([Kind::Status, Kind::Text]);
        kinds
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Index => "a configuration number",
            Kind::Number => "a number",
            Kind::Text => "text",
            Kind::Boolean => "true or false",
            Kind::Status => "a status (ok, failed, skipped, does-not-fit)",
            Kind::Any => "a value",
        }
    }

    /// Whether a JSON cell is of this kind (null is: a value not reported).
    fn holds_json(self, cell: &serde_json::Value) -> bool {
        match (self, cell) {
            (Kind::Index, cell) => cell.is_u64(),
            (Kind::Status, serde_json::Value::String(text)) => STATUSES.contains(&text.as_str()),
            (Kind::Status, _) => false,
            (_, serde_json::Value::Null) | (Kind::Any, _) => true,
            (Kind::Number, cell) => cell.is_number(),
            (Kind::Text, cell) => cell.is_string(),
            (Kind::Boolean, cell) => cell.is_boolean(),
        }
    }

    /// Whether a CSV field is of this kind (empty is: a value not reported).
    fn holds_csv(self, field: &str) -> bool {
        match self {
            Kind::Index => field.parse::<u64>().is_ok(),
            Kind::Status => STATUSES.contains(&field),
            _ if field.is_empty() => true,
            Kind::Number => field.parse::<f64>().is_ok_and(f64::is_finite),
            Kind::Boolean => field == "true" || field == "false",
            Kind::Text | Kind::Any => true,
        }
    }
}

const STATUSES: [&str; 4] = ["ok", "failed", "skipped", "does-not-fit"];

/// An output file as found on disk.
#[derive(Debug, Clone)]
pub struct Existing {
    /// Its header.
    pub header: Header,
    /// The configuration numbers of its complete rows, in file order.
    pub rows: Vec<u64>,
    /// Bytes up to the end of the last complete line; more is a partial row to cut off.
    pub complete_len: usize,
}

/// Reads an output file's text, which its name says is `format`: its header, the numbers of
/// its complete rows, and where a partial last line (a run stopped mid-write) starts. Every
/// complete row is checked against the header's columns and `kinds` (as [`Kind::columns`]
/// gives them, one per column of the header this sweep writes): its field count, its index
/// and the type of each cell. Errors name the line (counted from 1).
pub fn read_existing(text: &str, format: Format, kinds: &[Kind]) -> Result<Existing, String> {
    let found = Format::of_text(text);
    if found != format {
        let (name, other) = match format {
            Format::Csv => ("CSV", "JSON Lines"),
            Format::Jsonl => ("JSON Lines", "CSV (or not a sweep output)"),
        };
        return Err(format!("line 1: the file holds {other}, not the {name} its name asks for"));
    }
    let (header, mut at) = Header::parse(text).map_err(|e| format!("line 1: {e}"))?;
    let header_lines = text[..at].matches('\n').count();
    let mut rows = Vec::new();
    while let Some(end) = text[at..].find('\n') {
        let line = &text[at..at + end];
        let number = header_lines + rows.len() + 1;
        let index = check_row(line, format, &header.columns, kinds)
            .map_err(|reason| format!("line {number}: {reason}: {line:.60}"))?;
        rows.push(index);
        at += end + 1;
    }
    Ok(Existing { header, rows, complete_len: at })
}

/// Checks one complete row line against the columns and their kinds; its index.
fn check_row(line: &str, format: Format, columns: &[String], kinds: &[Kind]) -> Result<u64, String> {
    let index = row_index(line).ok_or("not a sweep row (no configuration number first)")?;
    // A header of other columns is refused by the caller; check the types only where the
    // kinds describe these columns.
    let typed = kinds.len() == columns.len();
    match format {
        Format::Csv => {
            if line.starts_with('{') {
                return Err("a JSON Lines row in CSV".into());
            }
            // One reader for parasim's CSV (crate::csv_text): a row is one record.
            let fields = match crate::csv_text::records(line)?.into_iter().next() {
                Some((_, fields)) => fields,
                None => return Err("an empty CSV row".into()),
            };
            if fields.len() != columns.len() {
                return Err(format!(
                    "{} fields where the header has {} columns",
                    fields.len(),
                    columns.len()
                ));
            }
            if typed {
                for ((field, kind), column) in fields.iter().zip(kinds).zip(columns) {
                    if !kind.holds_csv(field) {
                        return Err(format!("column {column} holds {field:?}, not {}", kind.name()));
                    }
                }
            }
        }
        Format::Jsonl => {
            let value: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
            let object = value.as_object().ok_or("not a JSON object")?;
            if object.len() != columns.len() {
                return Err(format!("{} keys where the header has {} columns", object.len(), columns.len()));
            }
            for (i, column) in columns.iter().enumerate() {
                let cell = object.get(column).ok_or_else(|| format!("no key {column:?}"))?;
                if typed && !kinds[i].holds_json(cell) {
                    return Err(format!("key {column:?} holds {cell}, not {}", kinds[i].name()));
                }
            }
        }
    }
    Ok(index)
}

/// Merges shard outputs (name, text) into one output of the whole sweep, in configuration
/// order. The shards must be of one sweep (same header but for the shard), each complete,
/// and together hold every configuration exactly once.
pub fn merge(inputs: &[(String, String)]) -> Result<String, String> {
    let Some((first_name, first_text)) = inputs.first() else {
        return Err("no shard files to merge".into());
    };
    let format = Format::of_text(first_text);
    let (first_header, _) = Header::parse(first_text).map_err(|e| format!("{first_name}: {e}"))?;
    // Configuration -> (the shard holding it, its line): as many entries as rows, whatever
    // count a header claims (issue 38: a header of 10^15 configurations aborted allocating).
    let mut owner: BTreeMap<u64, (usize, &str)> = BTreeMap::new();
    for (i, (name, text)) in inputs.iter().enumerate() {
        if Format::of_text(text) != format {
            return Err(format!(
                "{name} is not in the format of {first_name} (CSV and JSON Lines do not mix)"
            ));
        }
        let (header, mut at) = Header::parse(text).map_err(|e| format!("{name}: {e}"))?;
        let unsharded = |h: &Header| Header { shard: None, ..h.clone() };
        if unsharded(&header) != unsharded(&first_header) {
            let what = if header.fingerprint != first_header.fingerprint {
                format!(
                    "its fingerprint {:016x} differs from {first_name}'s {:016x}: another sweep file or base scenario, or another parasim build or data",
                    header.fingerprint, first_header.fingerprint
                )
            } else if header.columns != first_header.columns {
                format!("its columns differ from {first_name}'s")
            } else {
                format!("its header differs from {first_name}'s")
            };
            return Err(format!("{name} is from another sweep than {first_name}: {what}"));
        }
        let mut held = Vec::new();
        while let Some(end) = text[at..].find('\n') {
            let line = &text[at..at + end];
            let index = row_index(line)
                .filter(|index| *index < first_header.configurations)
                .ok_or_else(|| format!("{name}: a line is not a row of this sweep: {line:.60}"))?;
            if let Some((other, _)) = owner.insert(index, (i, line)) {
                return Err(format!(
                    "configuration {index} is in both {} and {name}: the shards overlap",
                    inputs[other].0
                ));
            }
            held.push(index);
            at += end + 1;
        }
        if at < text.len() {
            return Err(format!(
                "{name} ends in a partial row: the run stopped mid-write; finish it with --resume"
            ));
        }
        let expected = || -> Box<dyn Iterator<Item = u64>> {
            match header.shard {
                Some(shard) => Box::new(shard.indices(header.configurations)),
                None => Box::new(0..header.configurations),
            }
        };
        if !expected().eq(held.iter().copied()) {
            let configurations = header.configurations;
            let in_slice = |i: u64| i < configurations && header.shard.is_none_or(|shard| shard.contains(i));
            let slice_len = match header.shard {
                Some(shard) if shard.index < configurations => {
                    (configurations - shard.index).div_ceil(shard.count)
                }
                Some(_) => 0,
                None => configurations,
            };
            let kept: std::collections::BTreeSet<u64> =
                held.iter().copied().filter(|&i| in_slice(i)).collect();
            let missing = slice_len - kept.len() as u64;
            let first_missing = expected().take(held.len() + 1).find(|e| !kept.contains(e));
            let slice =
                header.shard.map_or("the sweep".to_string(), |s| format!("shard {}/{}", s.index, s.count));
            return Err(match first_missing {
                Some(first) => format!(
                    "{name} is incomplete: {missing} of the {slice_len} configurations of {slice} are missing (the first: {first}); finish it with --resume"
                ),
                None => format!("{name} does not hold {slice}'s configurations in order"),
            });
        }
    }
    let held = owner.len() as u64;
    if held < first_header.configurations {
        let first = (0..).find(|i| !owner.contains_key(i)).unwrap_or(held);
        return Err(format!(
            "the shards hold {held} of {} configurations: {} are missing (the first: {first}); is a shard file left out?",
            first_header.configurations,
            first_header.configurations - held
        ));
    }
    let mut merged = Header { shard: None, ..first_header }.text(format);
    for (_, line) in owner.values() {
        merged.push_str(line);
        merged.push('\n');
    }
    Ok(merged)
}
