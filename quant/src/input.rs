//! Reading inputs without hanging or exhausting memory: a path must be a regular file (opening
//! a FIFO blocks until a writer comes; a device such as /dev/zero never ends), and what is
//! read whole is read only up to a limit, checked before the first byte.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

/// Text inputs read whole (prompts, perplexity and calibration text): 64 MiB at most.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;
/// JSON inputs read whole (config.json, tokenizer.json, a safetensors index): 256 MiB.
pub const MAX_JSON_BYTES: u64 = 256 << 20;

/// Checks that `path` is a regular file (links followed), naming it and what it is otherwise.
pub fn check_regular(path: &Path) -> io::Result<fs::Metadata> {
    let m = fs::metadata(path)?;
    if m.is_file() {
        return Ok(m);
    }
    let what = if m.is_dir() { "a directory" } else { "not a regular file (a FIFO, device or socket)" };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is {what}", path.display())))
}

/// The bytes of `path`, a regular file of at most `limit` bytes (else an error naming the
/// file, its size and the limit).
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let len = check_regular(path)?.len();
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is {len} bytes, more than the {limit} bytes read at most", path.display()),
        ));
    }
    let mut v = Vec::with_capacity(len as usize);
    // `take` too: the file may grow while it is read.
    fs::File::open(path)?.take(limit).read_to_end(&mut v)?;
    Ok(v)
}

/// The first `max` bytes of the regular file `path` (all of it if shorter), cut back to a
/// whole UTF-8 character, as text; an error if it is not UTF-8 before that.
pub fn read_text_prefix(path: &Path, max: u64) -> io::Result<String> {
    check_regular(path)?;
    let mut v = Vec::new();
    fs::File::open(path)?.take(max).read_to_end(&mut v)?;
    let keep = match std::str::from_utf8(&v) {
        Ok(_) => v.len(),
        // A character cut by the limit: drop its first bytes.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(e) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not UTF-8 text (byte {})", path.display(), e.valid_up_to()),
            ));
        }
    };
    v.truncate(keep);
    Ok(String::from_utf8(v).expect("checked above"))
}

/// The text of `path`, a regular file of at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_limited(path, limit)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: not UTF-8 text: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_would_block_or_never_end() {
        let e = read_text(Path::new("/dev/zero"), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
        let e = read_text(&std::env::temp_dir(), 1 << 20).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let p = std::env::temp_dir().join(format!("duet-input-{}.txt", std::process::id()));
        fs::write(&p, "héllo world").unwrap();
        assert_eq!(read_text(&p, 100).unwrap(), "héllo world");
        let e = read_text(&p, 4).unwrap_err().to_string();
        assert!(e.contains("12 bytes, more than the 4 bytes"), "{e}");
        // A prefix cut inside "é" keeps the whole characters before it.
        assert_eq!(read_text_prefix(&p, 2).unwrap(), "h");
        assert_eq!(read_text_prefix(&p, 3).unwrap(), "hé");
        let _ = fs::remove_file(&p);
    }
}
