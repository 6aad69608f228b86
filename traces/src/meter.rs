//! Counts of a load under way (files, bytes, events), reported to a callback as the files are
//! read, so that a long replay can show how far it has got.

use std::cell::Cell;
use std::io::Read;

/// How far a load has got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCounts {
    /// Files read to their end.
    pub files_read: u64,
    /// Files to read.
    pub files: u64,
    /// Bytes read so far, as stored (a gzipped file's compressed bytes).
    pub bytes_read: u64,
    /// Bytes of all the files, as stored.
    pub bytes: u64,
    /// Trace events parsed so far (Kineto JSON; a binary trace or an execution trace counts
    /// none).
    pub events: u64,
}

/// What a load reports its counts to.
pub type ReadProgressFn<'a> = dyn Fn(ReadCounts) + 'a;

/// Reports are at most this many bytes apart while a file is read,
const REPORT_EVERY: u64 = 1 << 20;
/// and at most this many events apart.
const REPORT_EVENTS: u64 = 1 << 16;

/// The counts of one load and where they go; a `Meter` with no callback counts for nothing.
pub(crate) struct Meter<'a> {
    counts: Cell<ReadCounts>,
    reported_at: Cell<u64>,
    report: Option<&'a ReadProgressFn<'a>>,
}

impl<'a> Meter<'a> {
    /// A meter reporting to `report`.
    pub(crate) fn new(report: Option<&'a ReadProgressFn<'a>>) -> Meter<'a> {
        Meter { counts: Cell::new(ReadCounts::default()), reported_at: Cell::new(0), report }
    }

    /// The load will read `files` of `bytes` in all.
    pub(crate) fn begin(&self, files: &[std::path::PathBuf]) {
        let bytes = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        self.counts.set(ReadCounts { files: files.len() as u64, bytes, ..ReadCounts::default() });
        self.report();
    }

    /// One more file read to its end.
    pub(crate) fn file_done(&self) {
        let mut counts = self.counts.get();
        counts.files_read += 1;
        self.counts.set(counts);
        self.report();
    }

    /// Every file read: the bytes read are the bytes there are.
    pub(crate) fn finish(&self) {
        let mut counts = self.counts.get();
        counts.files_read = counts.files;
        counts.bytes_read = counts.bytes_read.max(counts.bytes);
        self.counts.set(counts);
        self.report();
    }

    /// One more event parsed.
    pub(crate) fn event(&self) {
        if self.report.is_some() {
            let mut counts = self.counts.get();
            counts.events += 1;
            self.counts.set(counts);
            if counts.events % REPORT_EVENTS == 0 {
                self.report();
            }
        }
    }

    fn bytes(&self, read: usize) {
        if self.report.is_none() {
            return;
        }
        let mut counts = self.counts.get();
        counts.bytes_read += read as u64;
        self.counts.set(counts);
        if counts.bytes_read >= self.reported_at.get() + REPORT_EVERY {
            self.report();
        }
    }

    fn report(&self) {
        if let Some(report) = self.report {
            let counts = self.counts.get();
            self.reported_at.set(counts.bytes_read);
            report(counts);
        }
    }
}

/// A reader that counts what it reads on a [`Meter`].
pub(crate) struct Metered<'m, 'a, R> {
    inner: R,
    meter: &'m Meter<'a>,
}

impl<'m, 'a, R> Metered<'m, 'a, R> {
    /// `inner`, counted on `meter`.
    pub(crate) fn new(inner: R, meter: &'m Meter<'a>) -> Self {
        Metered { inner, meter }
    }
}

impl<R: Read> Read for Metered<'_, '_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.meter.bytes(read);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::cell::RefCell;

    #[test]
    fn bytes_files_and_events_are_counted_and_reported() {
        let seen = RefCell::new(Vec::new());
        let report = |counts: ReadCounts| seen.borrow_mut().push(counts);
        let meter = Meter::new(Some(&report));
        let data = vec![7u8; 3 << 20];
        let mut read = Vec::new();
        Metered::new(&data[..], &meter).read_to_end(&mut read).unwrap();
        meter.event();
        meter.file_done();
        let last = *seen.borrow().last().unwrap();
        assert_eq!((last.bytes_read, last.events, last.files_read), (3 << 20, 1, 1));
        // Reported along the way, not only at the end.
        assert!(seen.borrow().len() >= 3, "{:?}", seen.borrow());
    }
}
