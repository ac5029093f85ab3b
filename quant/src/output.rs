//! Output files written so that nothing is lost: a target is checked before any work (absent
//! or a regular file — never a device, FIFO, directory or socket, never a symbolic link, and
//! never one of the command's inputs), written to a temporary file created exclusively under
//! a random name beside it, and renamed over it only once complete. The temporary file is
//! removed on every error, when its writer is dropped, and — through
//! [`remove_pending_before_exit`], which the CLI's signal handler calls — on SIGINT, SIGTERM
//! and SIGHUP. Every file the tools write goes through here: GGUF files, saved logits, reports, calibration's
//! temporary model ([`TempPath`]).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Temporary files alive now: removed by [`remove_pending_before_exit`] when the process is
/// stopped. Creating a temporary file and renaming one into place both happen under this lock, so
/// a signal handler that removes the pending files never races a rename that would bring
/// one back under its final name (the cause of a calibration model left in TMPDIR).
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending_files() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

fn unregister(p: &Path) {
    pending_files().retain(|q| q != p);
}

/// Removes every pending temporary file and keeps the lock until the process exits, so no
/// other thread creates a temporary file or renames one into place in between: what a
/// signal handler calls right before `exit`. Returns how many it removed.
pub fn remove_pending_before_exit() -> usize {
    let mut pending = pending_files();
    let removed = pending.drain(..).filter(|p| fs::remove_file(p).is_ok()).count();
    // Never unlocked: the writers block in `create_exclusive` or `rename_into_place`.
    std::mem::forget(pending);
    removed
}

/// Removes the pending temporary files that `which` selects (tests).
#[cfg(test)]
fn remove_pending_where(which: impl Fn(&Path) -> bool) -> usize {
    let mut pending = pending_files();
    let (gone, keep): (Vec<PathBuf>, Vec<PathBuf>) = pending.drain(..).partition(|p| which(p));
    *pending = keep;
    gone.iter().filter(|p| fs::remove_file(p).is_ok()).count()
}

/// Renames the pending temporary file `tmp` over `target` and forgets it, as one step
/// under the pending-files lock (see [`PENDING`]).
pub fn rename_into_place(tmp: &Path, target: &Path) -> io::Result<()> {
    let mut pending = pending_files();
    fs::rename(tmp, target)?;
    pending.retain(|q| q != tmp);
    Ok(())
}

/// The temporary files pending now (tests).
pub fn pending() -> Vec<PathBuf> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn refuse(target: &Path, why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("refusing to write {}: {why}", target.display()))
}

/// Whether `a` and `b` are the same file (device and inode; elsewhere the same canonical
/// path). False when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::metadata(a), fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    }
}

/// Checks that `target` may be written: absent, or a regular file that is none of `inputs`.
/// The error names the file and the reason.
pub fn check_target(target: &Path, inputs: &[&Path]) -> io::Result<()> {
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot check {}: {e}", target.display()))),
        Ok(m) if m.file_type().is_symlink() => {
            return Err(refuse(target, "it is a symbolic link (give the path of the file itself)"));
        }
        Ok(m) if !m.is_file() => {
            let what = if m.is_dir() { "a directory" } else { "not a regular file (a device, FIFO or socket)" };
            return Err(refuse(target, &format!("it is {what}")));
        }
        Ok(_) => {}
    }
    for input in inputs {
        if same_file(target, input) {
            return Err(refuse(target, &format!("it is also an input of this command ({})", input.display())));
        }
    }
    Ok(())
}

/// A random hex tag for temporary names (the standard library's per-process random hash
/// keys, the time and a counter: unguessable enough that a planted name is not in the way,
/// and creation is exclusive anyway).
fn random_tag() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    format!("{:016x}", h.finish())
}

/// Creates a new file `dir/.{stem}.{random}{suffix}` exclusively (never following or reusing
/// what is there), registered for [`remove_pending_before_exit`].
fn create_exclusive(dir: &Path, stem: &std::ffi::OsStr, suffix: &str) -> io::Result<(PathBuf, File)> {
    for _ in 0..16 {
        let mut name = OsString::from(".");
        name.push(stem);
        name.push(format!(".{}{suffix}", random_tag()));
        let path = dir.join(name);
        // Created and registered as one step: a signal between the two would leave the file.
        let mut pending = pending_files();
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => {
                pending.push(path.clone());
                return Ok((path, f));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create a file in {}: {e}", dir.display()))),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("cannot find a free temporary name in {}", dir.display())))
}

fn parent_of(target: &Path) -> &Path {
    target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Creates the temporary file for `target` beside it (its directory, so that the final
/// rename is atomic): a fresh random name, created exclusively, registered for
/// [`remove_pending_before_exit`] until [`rename_into_place`] or [`remove_temp`]. For
/// writers that manage the rename themselves (the GGUF writer); others use [`AtomicFile`].
pub fn create_temp_beside(target: &Path) -> io::Result<(PathBuf, File)> {
    let name = target.file_name().ok_or_else(|| refuse(target, "the path has no file name"))?;
    create_exclusive(parent_of(target), name, ".tmp")
}

/// Removes a temporary file that will not be renamed into place, and forgets it (files
/// renamed into place are forgotten by [`rename_into_place`]).
pub fn remove_temp(tmp: &Path) {
    let _ = fs::remove_file(tmp);
    unregister(tmp);
}

/// A file being written in place of its target: the temporary file beside it, renamed over
/// the target by [`AtomicFile::commit`], removed if dropped before or if the commit fails.
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
    /// Renamed over the target: nothing left to remove.
    placed: bool,
}

impl AtomicFile {
    /// Checks `target` ([`check_target`], no inputs: commands check theirs first) and
    /// creates the temporary file beside it.
    pub fn create(target: &Path) -> io::Result<AtomicFile> {
        check_target(target, &[])?;
        let (tmp, file) = create_temp_beside(target)?;
        Ok(AtomicFile { target: target.to_path_buf(), tmp, file: Some(file), placed: false })
    }

    /// The temporary file's path (error messages).
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The file to write (None only after commit).
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("an AtomicFile is written before it is committed")
    }

    /// Syncs the file and renames it over the target (checked again: it may have changed
    /// since), then syncs the directory where the platform allows. On failure the temporary
    /// file is removed (by the drop), as when dropped uncommitted.
    pub fn commit(mut self) -> io::Result<()> {
        self.sync_and_close()?;
        check_target(&self.target, &[])?;
        self.rename_over()?;
        self.sync_dir();
        Ok(())
    }

    /// As [`AtomicFile::commit`], but refuses to replace a file: the complete file is
    /// linked under the target's name, which fails atomically when that name exists, then
    /// the temporary name goes. Where the filesystem has no hard links it is renamed after
    /// checking that the target is still absent: a file created between that check and the
    /// rename is replaced.
    pub fn commit_new(mut self) -> io::Result<()> {
        self.sync_and_close()?;
        let exists = || io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", self.target.display()));
        match fs::hard_link(&self.tmp, &self.target) {
            // The drop removes the temporary name.
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(exists()),
            Err(_) if fs::symlink_metadata(&self.target).is_ok() => return Err(exists()),
            Err(_) => self.rename_over()?,
        }
        self.sync_dir();
        Ok(())
    }

    /// Syncs the written file and closes it.
    fn sync_and_close(&mut self) -> io::Result<()> {
        let file = self.file.take().expect("committed once");
        file.sync_all().map_err(|e| io::Error::new(e.kind(), format!("syncing {}: {e}", self.tmp.display())))
    }

    /// Renames the temporary file over the target: nothing is left for the drop to remove.
    fn rename_over(&mut self) -> io::Result<()> {
        rename_into_place(&self.tmp, &self.target).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot rename {} to {}: {e}", self.tmp.display(), self.target.display()))
        })?;
        self.placed = true;
        Ok(())
    }

    /// Makes the rename or link durable; not every platform or filesystem can sync a
    /// directory, and the data is already safe, so a failure here is not reported.
    fn sync_dir(&self) {
        if let Ok(d) = File::open(parent_of(&self.target)) {
            let _ = d.sync_all();
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.placed {
            drop(self.file.take());
            remove_temp(&self.tmp);
        }
    }
}

/// Writes `contents` to `target` through an [`AtomicFile`].
pub fn write_file(target: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = AtomicFile::create(target)?;
    f.file().write_all(contents)?;
    f.commit()
}

/// A path for a temporary file of the process's own (calibration's F16 model): a fresh,
/// unguessable name in `dir`, created empty and exclusively, registered for
/// [`remove_pending_before_exit`] and removed when dropped.
pub struct TempPath(PathBuf);

impl TempPath {
    pub fn new_in(dir: &Path, stem: &str, suffix: &str) -> io::Result<TempPath> {
        let (path, _) = create_exclusive(dir, std::ffi::OsStr::new(stem), suffix)?;
        Ok(TempPath(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        remove_temp(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("duet-output-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn writes_replace_only_whole_regular_files() {
        let d = scratch("replace");
        let t = d.join("out.bin");
        write_file(&t, b"one").unwrap();
        write_file(&t, b"two").unwrap();
        assert_eq!(fs::read(&t).unwrap(), b"two");
        // Dropped before commit: the target is untouched and no temporary file is left.
        {
            let mut f = AtomicFile::create(&t).unwrap();
            std::io::Write::write_all(f.file(), b"half").unwrap();
            assert!(pending().contains(&f.temp_path().to_path_buf()));
        }
        assert_eq!(fs::read(&t).unwrap(), b"two");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "only the target is left");
        // A commit that fails (the target became a directory meanwhile) leaves no temporary file.
        let late = d.join("late.bin");
        let mut f = AtomicFile::create(&late).unwrap();
        let tmp = f.temp_path().to_path_buf();
        std::io::Write::write_all(f.file(), b"x").unwrap();
        fs::create_dir(&late).unwrap();
        assert!(f.commit().unwrap_err().to_string().contains("a directory"));
        assert!(!tmp.exists() && !pending().contains(&tmp), "the failed commit left {}", tmp.display());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn commit_new_never_replaces_a_file() {
        let d = scratch("new");
        let t = d.join("saved.json");
        let mut f = AtomicFile::create(&t).unwrap();
        std::io::Write::write_all(f.file(), b"first").unwrap();
        let tmp = f.temp_path().to_path_buf();
        f.commit_new().unwrap();
        assert_eq!(fs::read(&t).unwrap(), b"first");
        assert!(!tmp.exists() && !pending().contains(&tmp), "the temporary name is gone");
        // A file that appeared between the check and the commit is kept, and nothing is left.
        let late = d.join("late.json");
        let mut f = AtomicFile::create(&late).unwrap();
        let tmp = f.temp_path().to_path_buf();
        std::io::Write::write_all(f.file(), b"second").unwrap();
        fs::write(&late, b"theirs").unwrap();
        let e = f.commit_new().unwrap_err();
        assert!(e.kind() == io::ErrorKind::AlreadyExists && e.to_string().contains("late.json"), "{e}");
        assert_eq!(fs::read(&late).unwrap(), b"theirs");
        assert!(!tmp.exists() && !pending().contains(&tmp), "the failed commit left {}", tmp.display());
        assert_eq!(fs::read_dir(&d).unwrap().count(), 2, "only the two targets are left");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn refuses_devices_directories_links_and_inputs() {
        let d = scratch("refuse");
        let e = write_file(Path::new("/dev/null"), b"x").unwrap_err().to_string();
        assert!(e.contains("/dev/null") && e.contains("not a regular file"), "{e}");
        let e = write_file(&d, b"x").unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let input = d.join("in.txt");
        fs::write(&input, b"text").unwrap();
        let e = check_target(&input, &[&input]).unwrap_err().to_string();
        assert!(e.contains("also an input"), "{e}");
        #[cfg(unix)]
        {
            let link = d.join("link");
            std::os::unix::fs::symlink(&input, &link).unwrap();
            let e = write_file(&link, b"x").unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{e}");
            // Hard links are the same file too.
            let hard = d.join("hard.txt");
            fs::hard_link(&input, &hard).unwrap();
            assert!(check_target(&hard, &[&input]).is_err());
        }
        assert_eq!(fs::read(&input).unwrap(), b"text");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn pending_files_are_removed_on_request() {
        let d = scratch("pending");
        let f = AtomicFile::create(&d.join("a.gguf")).unwrap();
        let t = TempPath::new_in(&d, "model", ".f16.gguf").unwrap();
        let (fp, tp) = (f.temp_path().to_path_buf(), t.path().to_path_buf());
        assert!(fp.exists() && tp.exists());
        // (Only this test's: the other tests' files are pending in this process too.)
        assert_eq!(remove_pending_where(|p| p.starts_with(&d)), 2);
        assert!(!fp.exists() && !tp.exists());
        drop((f, t));
        let _ = fs::remove_dir_all(&d);
    }
}
