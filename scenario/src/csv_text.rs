//! CSV as parasim writes and reads it, through the `csv` crate (RFC 4180): one writer
//! ([`line`]) for every CSV parasim writes (sweeps, `validate --csv`, `run --csv` and
//! `--buckets-csv`) and one reader ([`records`]) for the CSV it reads back (a sweep's output
//! on resume and merge).
//!
//! A field is quoted when it must be (a comma, a quote, a line break). A line with a `#` in any
//! field is written with every field quoted, so that `pandas.read_csv(path, comment="#")`,
//! which reads an unquoted `#` anywhere as the start of a comment, keeps the whole field.

/// One record as a CSV line, ending in a newline.
pub fn line<S: AsRef<str>>(fields: &[S]) -> String {
    let hash = fields.iter().any(|f| f.as_ref().contains('#'));
    let style = if hash { csv::QuoteStyle::Always } else { csv::QuoteStyle::Necessary };
    let mut writer = csv::WriterBuilder::new().quote_style(style).from_writer(Vec::new());
    // Writing to memory cannot fail: no I/O, and any &str is a field.
    let written = writer.write_record(fields.iter().map(AsRef::as_ref)).is_ok();
    let bytes = match writer.into_inner() {
        Ok(bytes) if written => bytes,
        _ => Vec::new(),
    };
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The records of CSV `text`, each with the 1-based line it starts on; lines starting with `#`
/// are comments and skipped. Records may have different lengths (the caller checks them
/// against its header). An error names the line.
pub fn records(text: &str) -> Result<Vec<(u64, Vec<String>)>, String> {
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
    let mut line_of = |position: &csv::Position| -> u64 {
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
        (1 + breaks) as u64
    };
    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|error| match error.position() {
            Some(position) => format!("line {}: {error}", line_of(position)),
            None => error.to_string(),
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

    /// What [`line`] writes, [`records`] reads back, whatever the fields hold.
    #[test]
    fn quoted_fields_round_trip() {
        let fields = ["plain", "a, b", "say \"hi\"", "two\nlines", "", " padded ", "1.5"];
        let text = line(&fields);
        assert_eq!(text, "plain,\"a, b\",\"say \"\"hi\"\"\",\"two\nlines\",, padded ,1.5\n");
        let read = records(&text).unwrap();
        assert_eq!(read, vec![(1, fields.iter().map(|f| f.to_string()).collect::<Vec<_>>())]);
    }

    /// A `#` anywhere quotes the whole line, and a comment line is skipped; a quoted `#` at
    /// the start of a line is data.
    #[test]
    fn a_hash_is_quoted_and_comment_lines_are_skipped() {
        let row = line(&["#1", "x # y", "ok"]);
        assert_eq!(row, "\"#1\",\"x # y\",\"ok\"\n");
        let text = format!("# a comment\na,b,c\n{row}");
        let read = records(&text).unwrap();
        assert_eq!(read[0], (2, vec!["a".to_string(), "b".into(), "c".into()]));
        assert_eq!(read[1], (3, vec!["#1".to_string(), "x # y".into(), "ok".into()]));
    }
}
