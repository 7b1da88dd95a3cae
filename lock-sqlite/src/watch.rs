//! Waking waiters: the wake file beside the database, watched with inotify.
//!
//! A release (or an eviction) commits, then writes one byte to `<database>-wake`. Every handle,
//! in every process, watches the database's directory with inotify and bumps a counter when
//! that file is written; a waiter parks on the counter and re-reads the key when it moves.
//!
//! Why a file of its own rather than the `-wal` file: SQLite writes the WAL before the commit
//! is visible (the wal-index in `-shm` is updated last, through a memory map, which inotify
//! does not see), so a waiter woken by the WAL write would often still find the key held and
//! sleep on. The wake file is written only after the commit returned. Why the directory and
//! not the file: a watch on the directory survives the file being deleted and created again.
//!
//! The watch is a hint, never the only way to learn: a waiter also wakes at the holder's expiry
//! and at least every [`FALLBACK`], so a lost event (a full inotify queue, a lock freed by some
//! other program's SQL, a file system that reports no events) costs a bounded delay.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The longest a waiter sleeps without re-reading its key while the watch runs.
pub(crate) const FALLBACK: Duration = Duration::from_millis(500);
/// The longest a waiter sleeps without re-reading its key when the watch cannot run.
pub(crate) const POLL_WITHOUT_WATCH: Duration = Duration::from_millis(100);

/// The wake file of the database at `path`: `<path>-wake`.
pub(crate) fn wake_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push("-wake");
    PathBuf::from(name)
}

/// Writes to the wake file after a commit that freed a key.
#[derive(Debug)]
pub(crate) struct Waker {
    file: File,
}

impl Waker {
    /// Opens (creating) the wake file of the database at `path`.
    pub(crate) fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(wake_path(path))?;
        Ok(Waker { file })
    }

    /// Tells every watcher that a key may be free. A failure only delays waiters until their
    /// fallback, so it is logged, not returned.
    pub(crate) fn wake(&self) {
        if let Err(error) = self.file.write_at(b"w", 0) {
            tracing::debug!(%error, "could not write the wake file; waiters fall back to polling");
        }
    }
}

/// The inotify watch of one handle: a counter that moves whenever the wake file is written.
/// The reading task is started on the runtime of the first waiter, and again if that runtime
/// has shut down since; it stops when the handle is dropped.
#[derive(Debug)]
pub(crate) struct Watch {
    dir: PathBuf,
    wake_name: OsString,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    changes: Arc<watch::Sender<u64>>,
    task: JoinHandle<()>,
}

impl Watch {
    /// A watch for the database at `path`. Checks that inotify works here (so the store can
    /// declare notified waits truthfully) without starting the task yet.
    pub(crate) fn new(path: &Path) -> io::Result<Self> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let wake_name = wake_path(path)
            .file_name()
            .map(OsStr::to_owned)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let watch = Watch {
            dir,
            wake_name,
            running: Mutex::new(None),
        };
        drop(watch.open_inotify()?);
        Ok(watch)
    }

    /// A receiver that sees every later write of the wake file, or `None` if the watch cannot
    /// run (the waiter then polls). Must be called within a tokio runtime.
    pub(crate) fn subscribe(&self) -> Option<watch::Receiver<u64>> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = running.as_ref() {
            if !current.task.is_finished() {
                return Some(current.changes.subscribe());
            }
        }
        match self.start() {
            Ok(started) => {
                let receiver = started.changes.subscribe();
                *running = Some(started);
                Some(receiver)
            }
            Err(error) => {
                tracing::debug!(%error, dir = %self.dir.display(), "cannot watch the wake file; polling");
                *running = None;
                None
            }
        }
    }

    /// Whether the reading task runs now.
    pub(crate) fn task_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| !r.task.is_finished())
    }

    fn open_inotify(&self) -> io::Result<OwnedFd> {
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let dir = CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mask = libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let watched = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir.as_ptr(), mask) };
        if watched < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    fn start(&self) -> io::Result<Running> {
        // SAFETY: the OwnedFd moves into the AsyncFd, which owns it until it is dropped, so
        // the descriptor stays open and the same for the AsyncFd's whole life.
        let fd =
            unsafe { AsyncFd::register_with_interest(self.open_inotify()?, Interest::READABLE) }
                .map_err(|e| io::Error::other(e.to_string()))?;
        let changes = Arc::new(watch::Sender::new(0u64));
        let task = tokio::spawn(read_events(fd, self.wake_name.clone(), changes.clone()));
        Ok(Running { changes, task })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(running) = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            running.task.abort();
        }
    }
}

/// Reads inotify events until aborted, bumping `changes` for every batch that names the wake
/// file (or reports that events were dropped).
async fn read_events(fd: AsyncFd<OwnedFd>, wake_name: OsString, changes: Arc<watch::Sender<u64>>) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let Ok(mut ready) = fd.readable().await else {
            return;
        };
        // SAFETY: reads into a buffer we own, of the length we pass.
        let read = unsafe {
            libc::read(
                fd.get_ref().as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
            )
        };
        if read < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::WouldBlock {
                ready.clear_ready();
                continue;
            }
            tracing::debug!(%error, "the inotify watch failed; waiters fall back to polling");
            return;
        }
        let read = usize::try_from(read).unwrap_or(0);
        if names_the_file(&buffer[..read], wake_name.as_bytes()) {
            changes.send_modify(|count| *count = count.wrapping_add(1));
        }
    }
}

/// Whether a batch of `inotify_event`s names `file`, or reports an overflow (events lost).
fn names_the_file(mut batch: &[u8], file: &[u8]) -> bool {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut hit = false;
    while batch.len() >= HEADER {
        // SAFETY: at least HEADER bytes remain; read_unaligned copes with any alignment.
        let event: libc::inotify_event = unsafe { std::ptr::read_unaligned(batch.as_ptr().cast()) };
        let len = usize::try_from(event.len).unwrap_or(usize::MAX);
        let Some(name) = batch.get(HEADER..HEADER.saturating_add(len)) else {
            break;
        };
        // The name is NUL-padded to its length.
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        if event.mask & libc::IN_Q_OVERFLOW != 0 || name == file {
            hit = true;
        }
        batch = &batch[HEADER + len..];
    }
    hit
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(mask: u32, name: &[u8]) -> Vec<u8> {
        let padded = (name.len() + 1).next_multiple_of(16);
        let header = libc::inotify_event {
            wd: 1,
            mask,
            cookie: 0,
            len: u32::try_from(padded).unwrap(),
        };
        let mut bytes = vec![0u8; std::mem::size_of::<libc::inotify_event>()];
        // SAFETY: the vector is exactly one header long.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
        let mut name = name.to_vec();
        name.resize(padded, 0);
        bytes.extend(name);
        bytes
    }

    #[test]
    fn only_the_wake_file_or_an_overflow_counts() {
        let other = event(libc::IN_MODIFY, b"locks.db-wal");
        let wake = event(libc::IN_MODIFY, b"locks.db-wake");
        let longer = event(libc::IN_MODIFY, b"locks.db-wake2");
        let overflow = event(libc::IN_Q_OVERFLOW, b"");
        assert!(!names_the_file(&other, b"locks.db-wake"));
        assert!(!names_the_file(&longer, b"locks.db-wake"));
        assert!(names_the_file(
            &[other.clone(), wake].concat(),
            b"locks.db-wake"
        ));
        assert!(names_the_file(&overflow, b"locks.db-wake"));
        // A truncated batch is read up to where it breaks off.
        assert!(!names_the_file(&other[..10], b"locks.db-wake"));
    }

    #[test]
    fn the_wake_file_sits_beside_the_database() {
        assert_eq!(
            wake_path(Path::new("/var/lib/x/locks.db")),
            Path::new("/var/lib/x/locks.db-wake")
        );
        assert_eq!(wake_path(Path::new("locks.db")), Path::new("locks.db-wake"));
    }
}
