//! Output files written whole or not at all: every file parasim writes (traces, plots, profiles,
//! man pages, CSV, merged sweeps) goes through [`write_with`], which writes a temporary file
//! in the output's own folder (`.NAME.XXXXXX.tmp`) and renames it over the final name only
//! once every byte is written and synced. A crash, a full disk or a write error leaves the
//! final name as it was (absent, or the previous complete file), never a file that looks
//! finished but is cut short; the temporary file is removed on error.
//!
//! An output that is not a regular file (`/dev/null`, `/dev/stdout`, a named pipe) cannot be
//! renamed over: it is written directly. A symbolic link at the final name is replaced by the
//! file, as a rename does.
//!
//! ```no_run
//! use std::io::Write;
//! traces::atomic::write_with(std::path::Path::new("out/plot.svg"), |file| file.write_all(b"<svg/>"))?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// Writes `path` with `write`, through a temporary file renamed over `path` when `write` has
/// returned `Ok` and the data is on disk. On any error the temporary file is removed and
/// `path` is left untouched. I/O errors name `path`.
pub fn write_with<T, E>(path: &Path, write: impl FnOnce(&mut BufWriter<File>) -> Result<T, E>) -> Result<T, E>
where
    E: From<io::Error>,
{
    if is_special(path) {
        let file =
            std::fs::OpenOptions::new().write(true).open(path).map_err(|e| named(path, "opening", e))?;
        let mut out = BufWriter::new(file);
        let value = write(&mut out)?;
        out.flush().map_err(|e| named(path, "writing", e))?;
        return Ok(value);
    }
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path.file_name().map_or_else(|| "output".into(), |n| n.to_string_lossy());
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // The permissions a plain create gives (0666 less the umask), not tempfile's private 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let temporary = builder
        .tempfile_in(folder)
        .map_err(|e| named(path, &format!("creating a temporary file in {} for", folder.display()), e))?;
    let (file, temporary_path) = temporary.into_parts();
    let mut out = BufWriter::new(file);
    // On error `temporary_path` is dropped, which removes the temporary file.
    let value = write(&mut out)?;
    let file = out.into_inner().map_err(|e| named(path, "writing", e.into_error()))?;
    file.sync_all().map_err(|e| named(path, "writing", e))?;
    drop(file);
    temporary_path.persist(path).map_err(|e| named(path, "renaming the finished file to", e.error))?;
    Ok(value)
}

/// Writes `bytes` to `path` as [`write_with`] does.
pub fn write(path: &Path, bytes: impl AsRef<[u8]>) -> io::Result<()> {
    write_with(path, |out| out.write_all(bytes.as_ref()))
}

/// Checks that `path` can be written where it is named: its folder exists and is a folder.
/// For commands that work long before they write (a calibration), so a typo in the output's
/// folder is refused up front.
pub fn check_folder(path: &Path) -> io::Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => return Ok(()),
    };
    if folder.is_dir() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: the folder {} does not exist; create it first", path.display(), folder.display()),
    ))
}

/// Whether `path` exists and is not a regular file or a link to one: a device or a pipe,
/// written in place.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

fn named(path: &Path, doing: &str, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{doing} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("parasim-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir
    }

    /// A writer that fails midway leaves no file under the final name and no temporary file.
    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = scratch("fail");
        let path = dir.join("out.svg");
        let result = write_with(&path, |out| {
            out.write_all(b"<svg>half")?;
            Err::<(), io::Error>(io::Error::other("disk full"))
        });
        assert!(result.is_err());
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(&dir).map(Iterator::count).ok(), Some(0));
    }

    /// A failed rewrite keeps the previous complete file.
    #[test]
    fn a_failed_rewrite_keeps_the_old_file() {
        let dir = scratch("keep");
        let path = dir.join("out.csv");
        write(&path, "old\n").expect("first write");
        let _ = write_with(&path, |out| {
            out.write_all(b"new, cut")?;
            Err::<(), io::Error>(io::Error::other("stopped"))
        });
        assert_eq!(fs_err::read_to_string(&path).ok().as_deref(), Some("old\n"));
        write(&path, "new\n").expect("second write");
        assert_eq!(fs_err::read_to_string(&path).ok().as_deref(), Some("new\n"));
        assert_eq!(std::fs::read_dir(&dir).map(Iterator::count).ok(), Some(1));
    }

    /// `/dev/null` is written in place (a rename over it would need to write in /dev).
    #[cfg(unix)]
    #[test]
    fn devices_are_written_in_place() {
        write(Path::new("/dev/null"), "nothing").expect("/dev/null");
    }
}
