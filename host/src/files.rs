//! Reading operator-supplied files (policies, plugins, the configuration)
//! safely: only regular files, never more than a cap. A FIFO would block a
//! reload forever and a link to `/dev/zero` would fill memory, so the file
//! is opened without blocking, its type is checked on the opened handle (not
//! on the path, which could be swapped between the check and the open), and
//! at most `max + 1` bytes are read.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Makes every file and directory this process creates from now on private
/// to its user: umask `077`, so files are `0600` and directories `0700` —
/// the data directory, the SQLite ledger and its journal, compiled plugins,
/// and the files of the embedded `redis-server` (a child inherits the mask).
/// The ledger holds recipient digests, business ids and provider errors;
/// the Redis files hold the payloads. Called first by `serve` and `worker`.
pub(crate) fn private_files() {
    // SAFETY: umask only swaps the process's file-mode mask; it cannot fail
    // and touches no memory.
    unsafe {
        libc::umask(0o077);
    }
}

/// The largest policy or configuration file read, in bytes (1 MiB).
pub(crate) const MAX_TEXT_FILE: u64 = 1 << 20;

/// Reads `path` whole if it is (or links to) a regular file of at most `max`
/// bytes; otherwise an `InvalidData` error saying what it is.
pub(crate) fn read_regular_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(format!("not a regular file ({})", kind(&meta))));
    }
    if meta.len() > max {
        return Err(too_large(max));
    }
    read_capped(file, max)
}

/// Reads `path` as UTF-8 text under the same rules, capped at [`MAX_TEXT_FILE`].
pub(crate) fn read_text_file(path: &Path) -> io::Result<String> {
    let bytes = read_regular_file(path, MAX_TEXT_FILE)?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reads at most `max` bytes; one more (the file grew) is an error.
fn read_capped(file: File, max: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(bytes)
}

fn refused(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn too_large(max: u64) -> io::Error {
    refused(format!(
        "larger than the {} cap",
        bytesize::ByteSize::b(max).display().iec()
    ))
}

/// What kind of file `meta` describes, in words.
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_regular_files_and_refuses_the_rest_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, "a = 1\n").unwrap();
        assert_eq!(read_text_file(&ok).unwrap(), "a = 1\n");
        let zero = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read_text_file(&zero).unwrap_err().to_string();
        assert!(err.contains("character device"), "{err}");
        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; 2 << 20]).unwrap();
        let err = read_text_file(&big).unwrap_err().to_string();
        assert!(err.contains("MiB cap"), "{err}");
        let err = read_regular_file(dir.path(), 10).unwrap_err().to_string();
        assert!(err.contains("directory"), "{err}");
    }
}
