//! A CSV table as `parasim sweep` and `parasim validate --csv` write it: optional `#` comment
//! lines (the sweep's header), a line of column names, then rows. Quoted fields may hold
//! commas, doubled quotes and line breaks (RFC 4180).
//!
//! Rows whose `status` column is anything but `ok` (a sweep's `failed`, `skipped`,
//! `does-not-fit`; a validation case's `pending`, `failed`) are set aside and counted
//! ([`Table::skipped`]): they have no results, and a chart must not draw them as zeros.

use std::fmt;

use crate::PlotError;

/// The largest magnitude a plotted value may have: far beyond any metric, and small enough
/// that an axis from `-MAX_MAGNITUDE` to `MAX_MAGNITUDE` has a finite span and finite ticks.
pub const MAX_MAGNITUDE: f64 = 1e300;

/// One row: its cells and the line of the file it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// 1-based line number in the file.
    pub line: usize,
    /// The cells, one per column.
    pub cells: Vec<String>,
}

/// Rows left out, counted by status in order of first appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped(pub Vec<(String, usize)>);

impl Skipped {
    /// No row was left out.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many rows were left out.
    pub fn total(&self) -> usize {
        self.0.iter().map(|(_, n)| n).sum()
    }

    fn add(&mut self, status: &str) {
        match self.0.iter_mut().find(|(s, _)| s == status) {
            Some((_, n)) => *n += 1,
            None => self.0.push((status.to_string(), 1)),
        }
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(status, n)| format!("{n} {}", if status.is_empty() { "without a status" } else { status }))
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// A parsed CSV file: its columns and its rows with status `ok` (or every row when it has no
/// `status` column).
#[derive(Debug, Clone)]
pub struct Table {
    /// The file's name, as errors print it.
    pub file: String,
    /// The column names.
    pub columns: Vec<String>,
    /// The rows kept.
    pub rows: Vec<Row>,
    skipped: Skipped,
}

impl Table {
    /// Parses CSV `text` read from `file` (the name errors print).
    pub fn parse(text: &str, file: &str) -> Result<Table, PlotError> {
        let records = records(text, file)?;
        let mut records =
            records.into_iter().filter(|(_, cells)| !(cells.len() == 1 && cells[0].trim().is_empty()));
        let Some((_, columns)) = records.next() else {
            return Err(PlotError::Csv {
                file: file.to_string(),
                line: 1,
                message: "the file has no line of column names".into(),
            });
        };
        let status = columns.iter().position(|c| c == "status");
        let mut rows = Vec::new();
        let mut skipped = Skipped::default();
        for (line, cells) in records {
            if cells.len() != columns.len() {
                return Err(PlotError::Csv {
                    file: file.to_string(),
                    line,
                    message: format!("{} fields, but the header has {} columns", cells.len(), columns.len()),
                });
            }
            match status.map(|s| cells[s].as_str()) {
                Some(status) if status != "ok" => skipped.add(status),
                _ => rows.push(Row { line, cells }),
            }
        }
        Ok(Table { file: file.to_string(), columns, rows, skipped })
    }

    /// Keeps only the rows whose `column` is `value` (`--where COLUMN=VALUE`: a slice of a sweep,
    /// one stage of a per-layer CSV). Cells and `value` that both read as numbers compare as
    /// numbers (`1` is `1.0`), others as text. An error names the column's values when no row
    /// has it.
    pub fn select(&mut self, column: &str, value: &str) -> Result<(), PlotError> {
        let index = self.column(column)?;
        let wanted = value.trim();
        let number = wanted.parse::<f64>().ok();
        let matches = |cell: &str| {
            let cell = cell.trim();
            match (number, cell.parse::<f64>().ok()) {
                (Some(a), Some(b)) => a == b,
                _ => cell == wanted,
            }
        };
        if !self.rows.iter().any(|row| matches(&row.cells[index])) {
            let mut values: Vec<&str> = Vec::new();
            for row in &self.rows {
                let cell = row.cells[index].trim();
                if !values.contains(&cell) {
                    values.push(cell);
                }
            }
            return Err(PlotError::NoMatch {
                file: self.file.clone(),
                column: column.to_string(),
                value: wanted.to_string(),
                values: values.into_iter().map(String::from).collect(),
            });
        }
        self.rows.retain(|row| matches(&row.cells[index]));
        Ok(())
    }

    /// The rows left out because their status is not `ok`.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// The index of column `name`.
    pub fn column(&self, name: &str) -> Result<usize, PlotError> {
        self.column_or(name, "")
    }

    /// The index of column `name`; `hint` (e.g. " (written by parasim sweep)") goes into the
    /// error when it is missing.
    pub fn column_or(&self, name: &str, hint: &str) -> Result<usize, PlotError> {
        self.columns.iter().position(|c| c == name).ok_or_else(|| PlotError::MissingColumn {
            file: self.file.clone(),
            column: name.to_string(),
            hint: hint.to_string(),
            available: self.columns.clone(),
        })
    }

    /// Row `row`'s cell of column `column` as a number: finite, and at most [`MAX_MAGNITUDE`] in
    /// magnitude, so that an axis's span, ticks and stacked sums stay finite (issue 38: `1e308`
    /// and `-1e308` drew a "NaN" tick).
    pub fn number(&self, row: &Row, column: usize) -> Result<f64, PlotError> {
        let text = row.cells[column].trim();
        let value =
            text.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(|| PlotError::NotANumber {
                file: self.file.clone(),
                line: row.line,
                column: self.columns[column].clone(),
                value: text.to_string(),
            })?;
        if value.abs() > MAX_MAGNITUDE {
            return Err(PlotError::OutOfRange {
                file: self.file.clone(),
                line: row.line,
                column: self.columns[column].clone(),
                value: text.to_string(),
            });
        }
        Ok(value)
    }

    /// An error if no row is left to plot.
    pub fn require_rows(&self) -> Result<(), PlotError> {
        if self.rows.is_empty() {
            return Err(PlotError::NoData { file: self.file.clone(), skipped: self.skipped.to_string() });
        }
        Ok(())
    }
}

/// Every record of `text` with the line it starts on, read by the `csv` crate (RFC 4180: quoted
/// fields may hold commas, doubled quotes and line breaks); a line starting with `#` is a comment
/// (the sweep's header; writers quote a field that starts with `#`).
fn records(text: &str, file: &str) -> Result<Vec<(usize, Vec<String>)>, PlotError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    // The line a record starts on. The reader's position of a record is where it began
    // reading it, before the comment and blank lines it skipped (its own line count leaves
    // comment lines out): skip those from the position's byte, and count the line breaks.
    // Records come in order: the line breaks are counted from the last record's position on,
    // so reading is linear in the text (counting from the start each time was quadratic).
    let (mut counted_to, mut breaks) = (0usize, 0usize);
    let mut line_of = |position: &csv::Position| -> usize {
        let mut at = usize::try_from(position.byte()).unwrap_or(usize::MAX).min(text.len());
        while text[at..].starts_with(['#', '\n', '\r']) {
            match text[at..].find('\n') {
                Some(end) => at += end + 1,
                None => break,
            }
        }
        if at < counted_to {
            (counted_to, breaks) = (0, 0);
        }
        breaks += text.as_bytes()[counted_to..at].iter().filter(|&&b| b == b'\n').count();
        counted_to = at;
        1 + breaks
    };
    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|error| PlotError::Csv {
            file: file.to_string(),
            line: error.position().map_or(0, &mut line_of),
            message: error.to_string(),
        })?;
        let line = record.position().map_or(0, &mut line_of);
        out.push((line, record.iter().map(str::to_string).collect()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn where_selects_rows_by_number_or_text() {
        let csv = "index,axis.nodes,axis.link,mfu,status,error\n0,1,100 Gb/s,0.5,ok,\n1,2.0,100 Gb/s,0.4,ok,\n\
                   2,2,200 Gb/s,0.45,ok,\n3,4,100 Gb/s,,failed,oom\n";
        let mut table = Table::parse(csv, "s.csv").unwrap();
        table.select("axis.nodes", "2").unwrap();
        assert_eq!(table.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [3, 4]);
        table.select("axis.link", "200 Gb/s").unwrap();
        assert_eq!(table.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [4]);
        let error = table.select("axis.link", "100 Gb/s").unwrap_err().to_string();
        assert_eq!(error, "s.csv: no row has axis.link = \"100 Gb/s\"; its values are: 200 Gb/s");
        let error = table.select("link", "1").unwrap_err().to_string();
        assert!(error.starts_with("s.csv: no column `link`"), "{error}");
    }

    #[test]
    fn comments_quotes_and_statuses() {
        let text = "# parasim sweep: configurations=3 fingerprint=0 file=a.toml\n\
                    index,name,value,status,error\n\
                    0,\"a, \"\"b\"\"\",1.5,ok,\n\
                    1,c,,failed,\"two\nlines\"\n\
                    2,\"#d\",2,ok,\n";
        let table = Table::parse(text, "t.csv").unwrap();
        assert_eq!(table.columns.len(), 5);
        assert_eq!(table.rows.len(), 2);
        assert_eq!(table.rows[0].cells[1], "a, \"b\"");
        assert_eq!(table.rows[0].line, 3, "the comment line counts");
        assert_eq!(table.rows[1].line, 6, "the quoted line break counts");
        assert_eq!(table.skipped().to_string(), "1 failed");
        assert_eq!(table.number(&table.rows[0], 2).unwrap(), 1.5);
        assert_eq!(table.rows[1].cells[1], "#d", "a quoted # is data, not a comment");
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        let table = Table::parse("x,y\n1,abc\n", "t.csv").unwrap();
        let error = table.number(&table.rows[0], 1).unwrap_err().to_string();
        assert_eq!(error, "t.csv: line 2: column `y`: \"abc\" is not a number");
        let error = table.column("z").unwrap_err().to_string();
        assert_eq!(error, "t.csv: no column `z`; the columns are: x, y");
        let error = Table::parse("x,y\n1\n", "t.csv").unwrap_err().to_string();
        assert_eq!(error, "t.csv: line 2: 1 fields, but the header has 2 columns");
        let error = Table::parse("", "t.csv").unwrap_err().to_string();
        assert!(error.contains("no line of column names"), "{error}");
    }
}
