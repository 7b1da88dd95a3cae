//! [`Lockout`]: SQLite's lock on a database file held from outside, for fault tests.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use fencelock_core::{Error, Result};

/// Where SQLite's unix VFS keeps its file locks (`os_unix.c`): the pending byte, the reserved
/// byte after it, then the 510-byte shared range. A write lock over all of them is what a
/// connection holding an exclusive lock has: nobody else can read or write.
const PENDING_BYTE: i64 = 0x4000_0000;
const LOCK_BYTES: i64 = 2 + 510;

/// Holds SQLite's exclusive lock on a database file, as a program stuck inside a write
/// transaction would, until dropped: every connection that opens the file meanwhile waits for
/// its busy timeout and fails with `SQLITE_BUSY`, which the store reports as a retryable
/// [`Error::Unavailable`]. Connections that already had the file open keep their shared lock,
/// so take the lockout before anyone opens the file.
///
/// The lock is an open-file-description lock (`F_OFD_SETLK`, Linux 3.15+), which conflicts with
/// SQLite's own locks in this process and in every other. For fault tests.
#[derive(Debug)]
pub struct Lockout {
    path: PathBuf,
    _file: File,
    /// A directory made for the lockout and removed with it.
    scratch: Option<PathBuf>,
}

impl Lockout {
    /// Opens (creating) the file at `path` and takes the lock, failing if anyone holds any
    /// SQLite lock on it.
    pub fn hold(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let lock = libc::flock {
            l_type: libc::F_WRLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: PENDING_BYTE,
            l_len: LOCK_BYTES,
            l_pid: 0,
        };
        // SAFETY: fcntl on a descriptor we own, with a flock that lives across the call.
        let taken = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
        if taken != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Lockout {
            path: path.to_owned(),
            _file: file,
            scratch: None,
        })
    }

    /// A lockout on a new, empty database file in a new directory under the system's temporary
    /// directory; both are removed when it is dropped.
    pub(crate) fn fresh() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "fencelock-sqlite-locked-out-{}-{:016x}",
            std::process::id(),
            rand_suffix()
        ));
        let fail = |e: io::Error| Error::unavailable("cannot make a locked-out database", e);
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let mut lockout = Lockout::hold(&dir.join("locked-out.db")).map_err(fail)?;
        lockout.scratch = Some(dir);
        Ok(lockout)
    }

    /// The locked file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lockout {
    fn drop(&mut self) {
        if let Some(dir) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn rand_suffix() -> u64 {
    fencelock_core::OwnerId::random().as_u128() as u64
}
