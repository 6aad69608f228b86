//! The binary trace format, `.pstrace`: an imported [`Trace`] as it is in memory, so loading
//! it skips JSON parsing and linking entirely.
//!
//! Layout (little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic number `PSTRACE\0` |
//! | 4 | format version (currently 1) |
//! | 4 | flags (0; reserved) |
//! | 8 | payload length in bytes |
//! | 8 | FNV-1a 64-bit hash of the payload |
//! | n | payload: the [`Trace`] in postcard encoding |
//!
//! Reading checks each field in turn, so a file that is not a `.pstrace`, is from a newer
//! version, is truncated or is corrupt gets an error saying which, never a panic; the decoded
//! trace is then validated like an imported one.
//!
//! ```
//! # use traces::binary;
//! let bytes = b"PSTRACE\0\x01\x00\x00\x00";
//! let error = binary::from_bytes(bytes, std::path::Path::new("short.pstrace")).unwrap_err();
//! assert!(error.to_string().contains("truncated"));
//! ```

use std::io::Read;
use std::path::Path;

use crate::error::TraceError;
use crate::model::Trace;

/// The first eight bytes of every `.pstrace` file.
pub const MAGIC: [u8; 8] = *b"PSTRACE\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Header length in bytes.
const HEADER: usize = 32;

/// FNV-1a, 64 bits: a cheap check that the payload is what was written.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Encodes `trace` as a `.pstrace` byte string.
pub fn to_bytes(trace: &Trace) -> Result<Vec<u8>, TraceError> {
    let payload = postcard::to_stdvec(trace)
        .map_err(|e| TraceError::OutOfRange { what: "binary encoding".into(), message: e.to_string() })?;
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&fnv1a(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Decodes a `.pstrace` byte string; `path` names it in errors.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Trace, TraceError> {
    let bad = |reason: String| TraceError::Binary { path: path.to_path_buf(), reason };
    if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
        return Err(bad("not a parasim binary trace (no PSTRACE magic number at the start)".into()));
    }
    if bytes.len() < HEADER {
        return Err(bad(format!("truncated: {} bytes, shorter than the {HEADER}-byte header", bytes.len())));
    }
    let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let u64_at = |at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(word)
    };
    let version = u32_at(8);
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}, but this parasim reads version {VERSION}; convert the original trace again"
        )));
    }
    let flags = u32_at(12);
    if flags != 0 {
        return Err(bad(format!("unknown flags {flags:#x}")));
    }
    let length = u64_at(16);
    let payload = &bytes[HEADER..];
    if (payload.len() as u64) < length {
        return Err(bad(format!(
            "truncated: the header announces {length} bytes of payload, the file has {}",
            payload.len()
        )));
    }
    if payload.len() as u64 > length {
        return Err(bad(format!("{} bytes after the end of the payload", payload.len() as u64 - length)));
    }
    if fnv1a(payload) != u64_at(24) {
        return Err(bad("corrupt: the payload does not match its checksum".into()));
    }
    let (trace, rest): (Trace, &[u8]) =
        postcard::take_from_bytes(payload).map_err(|e| bad(format!("corrupt payload: {e}")))?;
    if !rest.is_empty() {
        return Err(bad(format!("corrupt payload: {} bytes left over after the trace", rest.len())));
    }
    trace.validate(path)?;
    Ok(trace)
}

/// Writes `trace` to `path` as a `.pstrace` file, through a temporary name ([`crate::atomic`]).
pub fn write(trace: &Trace, path: &Path) -> Result<(), TraceError> {
    let bytes = to_bytes(trace)?;
    crate::atomic::write(path, bytes).map_err(|e| TraceError::io(path, e))
}

/// Reads the `.pstrace` file at `path`.
pub fn read(path: &Path) -> Result<Trace, TraceError> {
    let bytes = fs_err::read(path).map_err(|e| TraceError::io(path, e))?;
    from_bytes(&bytes, path)
}

/// True if the file at `path` starts with the `.pstrace` magic number (false if it cannot be
/// read: the JSON reader will then report the problem).
pub fn has_magic(path: &Path) -> bool {
    let mut head = [0u8; 8];
    fs_err::File::open(path).and_then(|mut file| file.read_exact(&mut head)).is_ok() && head == MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
