//! Standard output and standard error, written as ripgrep does: no command panics or changes
//! its exit status because either was closed (`parasim sweep S.toml 2>&1 | head`).
//!
//! - Standard error carries notes, warnings and the final `error:` line. [`stderr!`] writes
//!   a line and ignores a write error: the message is lost, the exit status (2 for an error,
//!   1 for broken bounds, 0 for success) stays.
//! - Standard output carries the report. [`print`] returns the write error; `main` turns a
//!   broken pipe ([`closed_pipe`]) into success, exit 0 and nothing printed, as `head` wants.
//!
//! Nothing else in the binary prints: `main.rs` denies `println!` and `eprintln!`, which
//! panic on a closed stream.

use std::io::Write;

/// Writes a line to standard error, as `eprintln!` does, but ignores a write error (standard
/// error closed) instead of panicking.
macro_rules! stderr {
    ($($arg:tt)*) => {
        $crate::output::stderr_line(::std::format_args!($($arg)*))
    };
}
pub(crate) use stderr;

/// The line [`stderr!`] writes; a write error is ignored.
pub fn stderr_line(line: std::fmt::Arguments<'_>) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{line}");
    let _ = stderr.flush();
}

/// Writes `bytes` to standard output and flushes it. A closed standard output comes back as
/// an error of kind `BrokenPipe`, which `main` treats as success ([`closed_pipe`]).
pub fn print(bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes.as_ref())?;
    stdout.flush()
}

/// Whether `error` comes from a closed pipe (`parasim run | head`): not an error, the reader
/// has all it wanted.
pub fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
