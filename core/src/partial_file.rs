//! An output file that has a name only once it is complete.
//!
//! [`PartialFile::create`] opens the file to write; [`PartialFile::persist`] gives it its
//! name. What a process ended in between leaves:
//!
//! - Nothing on Linux, whatever ended it (SIGKILL, SIGTERM, Ctrl-C, a power cut). The file
//!   is created unnamed (`O_TMPFILE` in the destination's directory): it is an inode
//!   without a directory entry, freed by the kernel when the process dies, and
//!   `persist` links it into place (`linkat` through `/proc/self/fd`, or `AT_EMPTY_PATH`
//!   where `/proc` is not mounted). When the destination does not exist yet, the link
//!   creates it directly; when it does, the file is linked to a temporary name and renamed
//!   over it, so that replacing a file stays atomic (the one moment a kill could leave a
//!   name behind is between those two calls).
//! - Elsewhere, and on Linux file systems that refuse `O_TMPFILE`, the file is a named
//!   temporary file in the destination's directory, removed when the writer is dropped
//!   unfinished (an error, a panic that unwinds) and, on Unix, by a handler of SIGINT and
//!   SIGTERM ([`on_signal`]); a process killed by SIGKILL leaves it.
//!
//! Every temporary name starts with [`PARTIAL_PREFIX`], and the writer holds an exclusive
//! `flock` on its file while it lives. [`PartialFile::create`] first removes every file of
//! that prefix in the directory that nobody holds locked: those of killed conversions,
//! including files of flm versions before the lock, which named every partial file so. (A
//! named file is locked just after it is created: a conversion starting in the same
//! directory at that very moment could remove it, and the first one then fails when it
//! renames it, instead of leaving a wrong file.)

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The name prefix of every temporary output file.
pub(crate) const PARTIAL_PREFIX: &str = ".flm-partial-";

/// An output file that has a name only once it is complete ([`PartialFile::persist`]):
/// on Linux an unnamed file (`O_TMPFILE`) linked into place, elsewhere a temporary file in
/// the destination's directory, removed when dropped unfinished or on SIGINT and SIGTERM.
/// A process killed while writing leaves the destination as it was.
pub struct PartialFile {
    file: File,
    dest: PathBuf,
    name: Name,
}

/// The name a [`PartialFile`] has while it is written.
enum Name {
    /// None (`O_TMPFILE`).
    #[cfg(target_os = "linux")]
    Unnamed,
    /// A temporary name, removed on drop, and on SIGINT and SIGTERM while registered.
    Temporary(tempfile::TempPath, on_signal::Registration),
}

/// The directory `dest` will be created in.
fn parent_dir(dest: &Path) -> &Path {
    match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

impl PartialFile {
    /// Removes the stale partial files of `dest`'s directory, then opens a file to write
    /// `dest` into (readable by everyone: a model file is not a secret).
    pub fn create(dest: &Path) -> io::Result<PartialFile> {
        let dir = parent_dir(dest);
        remove_stale(dir);
        #[cfg(target_os = "linux")]
        if let Some(file) = unnamed(dir)? {
            return Ok(PartialFile {
                file,
                dest: dest.to_path_buf(),
                name: Name::Unnamed,
            });
        }
        named(dest)
    }

    /// Syncs the file to disk and gives it its name, replacing any file of that name.
    pub fn persist(self) -> io::Result<()> {
        self.file.sync_all()?;
        match self.name {
            Name::Temporary(temp, registration) => {
                let renamed = temp.persist(&self.dest).map_err(|e| e.error);
                // Only now: a signal before the rename must still remove the file.
                drop(registration);
                renamed
            }
            #[cfg(target_os = "linux")]
            Name::Unnamed => link_unnamed(&self.file, &self.dest),
        }
    }
}

impl Write for PartialFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// A named temporary file in `dest`'s directory, locked, registered for removal on
/// SIGINT and SIGTERM.
fn named(dest: &Path) -> io::Result<PartialFile> {
    let named = tempfile::Builder::new()
        .prefix(PARTIAL_PREFIX)
        .tempfile_in(parent_dir(dest))?;
    let (file, temp) = named.into_parts();
    file.lock()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    let registration = on_signal::register(&temp);
    Ok(PartialFile {
        file,
        dest: dest.to_path_buf(),
        name: Name::Temporary(temp, registration),
    })
}

/// Removes every file of `dir` named with [`PARTIAL_PREFIX`] that no live writer holds
/// locked. Best effort: a file that cannot be opened, locked or removed is left.
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(PARTIAL_PREFIX.as_bytes())
        {
            continue;
        }
        let path = entry.path();
        let Ok(file) = OpenOptions::new().read(true).open(&path) else {
            continue;
        };
        // The lock is held until `file` is dropped, after the removal, so that a writer
        // cannot take the file over in between.
        if file.try_lock().is_ok() && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// An unnamed file in `dir`, locked, or `None` where the file system refuses `O_TMPFILE`.
#[cfg(target_os = "linux")]
fn unnamed(dir: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o644)
        .open(dir);
    match opened {
        Ok(file) => {
            file.lock()?;
            Ok(Some(file))
        }
        // Refused by the file system (EOPNOTSUPP), or by a kernel older than 3.11 (which
        // reads O_TMPFILE as O_DIRECTORY: EISDIR, or EINVAL).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Gives the unnamed `file` the name `dest`: a link made directly when `dest` does not
/// exist, else a link to a temporary name renamed over `dest`.
#[cfg(target_os = "linux")]
fn link_unnamed(file: &File, dest: &Path) -> io::Result<()> {
    match link(file, dest) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        done => return done,
    }
    let dir = parent_dir(dest);
    let mut attempt = 0;
    loop {
        let temp = dir.join(format!("{PARTIAL_PREFIX}{}-{attempt}", std::process::id()));
        match link(file, &temp) {
            Ok(()) => {
                return std::fs::rename(&temp, dest).inspect_err(|_| {
                    let _ = std::fs::remove_file(&temp);
                })
            }
            // A name left by a killed process of the same id, still locked by a live one
            // or not removable: try the next.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Links the open `file` at `path` (`linkat` of `/proc/self/fd/N`, or `AT_EMPTY_PATH`
/// where `/proc` is not mounted).
#[cfg(target_os = "linux")]
fn link(file: &File, path: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let fd = file.as_raw_fd();
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let target = CString::new(path.as_os_str().as_bytes()).map_err(invalid)?;
    let proc_path = CString::new(format!("/proc/self/fd/{fd}")).map_err(invalid)?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call; linkat only
    // reads them.
    let linked = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if linked == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::ENOENT) {
        return Err(error);
    }
    // SAFETY: `fd` is open for the call (`file` is borrowed), the empty path and `target`
    // are NUL-terminated strings that outlive it.
    let linked = unsafe {
        libc::linkat(
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if linked == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removal of the named partial files on SIGINT and SIGTERM (Unix).
///
/// The paths of the live named files sit in a fixed table of atomic pointers, which a
/// signal handler can read: it unlinks each (`unlink` is async-signal-safe), restores the
/// default action and raises the signal again, so that the process ends by it as it would
/// have without the handler. The handlers are installed when the first named file is
/// registered, and only for a signal whose action is still the default: a host
/// application's own handler is left alone (its files are then removed by the next
/// conversion into the same directory, as those of SIGKILL are).
#[cfg(unix)]
mod on_signal {
    use std::ffi::{c_char, c_int, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::ptr;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::Once;

    /// Named files registered at once at most; more are not removed on a signal.
    const SLOTS: usize = 64;

    /// The registered paths: C strings from [`CString::into_raw`], or null.
    static PENDING: [AtomicPtr<c_char>; SLOTS] = [const { AtomicPtr::new(ptr::null_mut()) }; SLOTS];

    /// A path in [`PENDING`], removed from it on drop.
    pub(crate) struct Registration(Option<usize>);

    /// Registers `path` for removal on SIGINT and SIGTERM.
    pub(crate) fn register(path: &Path) -> Registration {
        install();
        let Ok(path) = CString::new(path.as_os_str().as_bytes()) else {
            return Registration(None);
        };
        let raw = path.into_raw();
        for (i, slot) in PENDING.iter().enumerate() {
            let free =
                slot.compare_exchange(ptr::null_mut(), raw, Ordering::AcqRel, Ordering::Acquire);
            if free.is_ok() {
                return Registration(Some(i));
            }
        }
        // SAFETY: `raw` comes from `into_raw` above and was stored nowhere.
        drop(unsafe { CString::from_raw(raw) });
        Registration(None)
    }

    impl Drop for Registration {
        fn drop(&mut self) {
            let Some(i) = self.0 else { return };
            let raw = PENDING[i].swap(ptr::null_mut(), Ordering::AcqRel);
            if !raw.is_null() {
                // SAFETY: the slot held a pointer from `into_raw` (`register`), and this
                // swap took it out alone (the handler takes what it removes likewise).
                drop(unsafe { CString::from_raw(raw) });
            }
        }
    }

    /// The handler: removes every registered file, then ends the process by `signal`.
    extern "C" fn remove_and_reraise(signal: c_int) {
        for slot in &PENDING {
            let raw = slot.swap(ptr::null_mut(), Ordering::AcqRel);
            if !raw.is_null() {
                // SAFETY: a NUL-terminated path from `register`, taken out of its slot by
                // this swap alone; unlink is async-signal-safe. The string is not freed
                // (free is not async-signal-safe, and the process is ending).
                unsafe { libc::unlink(raw) };
            }
        }
        // SAFETY: signal and raise are async-signal-safe; with the default action back,
        // raise ends the process by `signal`.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }

    /// Installs the handler for SIGINT and SIGTERM where their action is the default, once.
    fn install() {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            for signal in [libc::SIGINT, libc::SIGTERM] {
                // SAFETY: `sigaction` with a null new action only reads the current one
                // into `old`, a zeroed (valid) struct; the new action is a zeroed struct
                // with an empty mask and the handler, an `extern "C" fn(c_int)` that
                // only makes async-signal-safe calls.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(signal, ptr::null(), &mut old) != 0
                        || old.sa_sigaction != libc::SIG_DFL
                    {
                        continue;
                    }
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = remove_and_reraise as extern "C" fn(c_int) as usize;
                    libc::sigemptyset(&mut new.sa_mask);
                    libc::sigaction(signal, &new, ptr::null_mut());
                }
            }
        });
    }
}

/// No signal handling where there are no Unix signals.
#[cfg(not(unix))]
mod on_signal {
    use std::path::Path;

    /// Nothing registered.
    pub(crate) struct Registration;

    /// Registers nothing.
    pub(crate) fn register(_: &Path) -> Registration {
        Registration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_named_partial_file_is_removed_on_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let partial = named(&dir.path().join("m.flm")).unwrap();
        let path = match &partial.name {
            Name::Temporary(temp, _) => temp.to_path_buf(),
            #[cfg(target_os = "linux")]
            Name::Unnamed => unreachable!("named() gives a named file"),
        };
        assert!(path.exists());
        // SAFETY: the child (a copy of this multi-threaded process) only makes
        // async-signal-safe calls: raise, and _exit should the signal not end it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::raise(libc::SIGTERM);
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` is valid for a write.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM,
            "the child ended by status {status:#x}"
        );
        assert!(!path.exists(), "the handler left {}", path.display());
    }
}
