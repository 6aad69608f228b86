//! One writer per sweep output: a sweep (fresh or `--resume`) and `sweep merge` hold an
//! exclusive lock on `OUT.lock`, beside the output, for as long as they write it. A second
//! writer (a Slurm requeue beside its original, two sweeps given one `-o`) is refused with the
//! holder's pid, host and start time, which the holder writes into the lock file.
//!
//! The lock is the operating system's (`flock` on Unix, through std's `File::try_lock`): it
//! goes with the process, so a killed sweep leaves no stale lock, only the file, which the next
//! writer takes over. The holder removes the file when it is done.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// An exclusive lock on an output, released (and its lock file removed) on drop.
#[derive(Debug)]
pub struct OutputLock {
    file: std::fs::File,
    path: PathBuf,
}

impl OutputLock {
    /// Locks `output` for this process, or says who holds it. `what` describes this writer in
    /// the lock file (e.g. `parasim sweep`).
    pub fn acquire(output: &Path, what: &str) -> anyhow::Result<OutputLock> {
        let mut name = output.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| {
                    format!("{}: creating the lock file {}", output.display(), path.display())
                })?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = holder.trim();
                    let holder = if holder.is_empty() { "another process (starting up)" } else { holder };
                    bail!(
                        "{}: in use: {holder} is writing it (lock file {}); wait for it to finish, or write to another file",
                        output.display(),
                        path.display()
                    );
                }
                Err(std::fs::TryLockError::Error(error)) => {
                    return Err(error).with_context(|| {
                        format!(
                            "{}: cannot lock {} (does this file system support locks?)",
                            output.display(),
                            path.display()
                        )
                    });
                }
            }
            // A holder that finished removes the file after we opened it: our lock is then on
            // a file no other writer can see. Lock the file the name holds now instead.
            if same_file(&file, &path) {
                let holder = format!(
                    "{what} (pid {} on {}, started {})",
                    std::process::id(),
                    gethostname::gethostname().to_string_lossy(),
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                );
                file.set_len(0)?;
                file.rewind()?;
                file.write_all(holder.as_bytes())?;
                file.write_all(b"\n")?;
                file.flush()?;
                return Ok(OutputLock { file, path });
            }
        }
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still held, so a waiting writer never locks a file about to vanish
        // without noticing (it checks the name still holds its file).
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

#[cfg(unix)]
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &std::fs::File, path: &Path) -> bool {
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second lock on one output is refused naming the output and this process; it is free
    /// again once the first is dropped, and the lock file is gone.
    #[test]
    fn a_second_writer_is_refused() {
        let dir = std::env::temp_dir().join(format!("parasim-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        let output = dir.join("out.csv");
        let first = OutputLock::acquire(&output, "parasim sweep").expect("first lock");
        let error = OutputLock::acquire(&output, "parasim sweep").expect_err("second lock");
        let message = format!("{error:#}");
        assert!(message.contains("out.csv: in use"), "{message}");
        assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
        drop(first);
        assert!(!dir.join("out.csv.lock").exists());
        drop(OutputLock::acquire(&output, "parasim sweep").expect("lock after release"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
