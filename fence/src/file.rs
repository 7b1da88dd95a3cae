//! A file on local disk as a fenced resource, for jobs on one host (`lockctl run` with a
//! fencing token in `LOCK_FENCING_TOKEN`).
//!
//! Three paths, side by side:
//! - `PATH`: the data, always replaced whole (written to a temporary file, synced, renamed
//!   over), so a reader sees the old or the new contents, never a mix;
//! - `PATH.fence`: the highest token that claimed the data, in decimal, replaced the same way;
//! - `PATH.lock`: an empty file, never replaced, that every step holds an exclusive `flock` on.
//!
//! The lock is what makes the check honest: between processes, reading the fence and then
//! renaming is a race (a newer holder could claim in between, and the older rename would land
//! after it). Every step checks and renames while holding it, so steps from all processes are
//! applied one at a time. Another program that writes these files must take the same lock
//! (for example `flock PATH.lock …`).
//!
//! The steps block the calling thread (on the lock and on `fsync`). From async code use the
//! `_async` steps ([`FencedFile::claim_async`], [`FencedFile::write_async`],
//! [`FencedFile::replace_async`]), which run them on tokio's blocking pool so the runtime's
//! threads never wait.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use fencelock_core::{Error, Result};

/// A file whose writes are fenced: [`claim`](FencedFile::claim) then
/// [`write`](FencedFile::write) for a read-modify-write, [`replace`](FencedFile::replace) for a
/// one-step write. See the [module docs](self) for the files it uses.
///
/// ```no_run
/// use fencelock_fence::FencedFile;
///
/// let token: u64 = std::env::var("LOCK_FENCING_TOKEN")?.parse()?;
/// let report = FencedFile::new("/var/lib/export/last-run");
/// let previous = report.claim(token)?;               // every lower token is refused now
/// let runs = previous.map_or(0, |p| String::from_utf8_lossy(&p).lines().count());
/// report.write(token, format!("run {}\n", runs + 1))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedFile {
    data: PathBuf,
    fence: PathBuf,
    lock: PathBuf,
}

impl FencedFile {
    /// The data at `path`, its token at `path.fence`, its lock at `path.lock`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let data = path.into();
        FencedFile {
            fence: with_suffix(&data, ".fence"),
            lock: with_suffix(&data, ".lock"),
            data,
        }
    }

    /// The data file.
    pub fn path(&self) -> &Path {
        &self.data
    }

    /// The file holding the highest token that claimed the data.
    pub fn fence_path(&self) -> &Path {
        &self.fence
    }

    /// The file every step holds an exclusive `flock` on.
    pub fn lock_path(&self) -> &Path {
        &self.lock
    }

    /// Claims the file for `token` and returns its contents (`None` if it does not exist).
    /// From then on every lower token is refused. Refused with [`Error::StaleToken`] if a
    /// greater token claimed it. A claim is recorded even when the data does not exist yet.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed;
    /// [`Store`](fencelock_core::ErrorKind::Store) when a file cannot be opened, locked, read
    /// or replaced, or `PATH.fence` holds no token.
    pub fn claim(&self, token: u64) -> Result<Option<Vec<u8>>> {
        let _lock = self.lock()?;
        let fence = self.read_fence()?;
        if token < fence {
            return Err(crate::refused(token, fence));
        }
        if token != fence {
            replace_file(&self.fence, token.to_string().as_bytes())?;
        }
        match fs::read(&self.data) {
            Ok(contents) => Ok(Some(contents)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("read", &self.data, e)),
        }
    }

    /// Replaces the contents only while the file still carries the claim `token`. Refused
    /// with [`Error::StaleToken`] if a greater token claimed it since; a token that never
    /// claimed it is refused as [`Error::InvalidInput`]. The old contents stay on a refusal.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed
    /// since; [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a token that never
    /// claimed; [`Store`](fencelock_core::ErrorKind::Store) when a file cannot be opened,
    /// locked, read or replaced, or `PATH.fence` holds no token.
    pub fn write(&self, token: u64, contents: impl AsRef<[u8]>) -> Result<()> {
        let _lock = self.lock()?;
        let fence = self.read_fence()?;
        if token != fence {
            return Err(crate::refused(token, fence));
        }
        replace_file(&self.data, contents.as_ref())
    }

    /// A one-step write: replaces the contents if no greater token claimed the file, and
    /// records `token`. Refused with [`Error::StaleToken`] otherwise. For contents that do not
    /// depend on an earlier read.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed;
    /// [`Store`](fencelock_core::ErrorKind::Store) when a file cannot be opened, locked, read
    /// or replaced, or `PATH.fence` holds no token.
    pub fn replace(&self, token: u64, contents: impl AsRef<[u8]>) -> Result<()> {
        let _lock = self.lock()?;
        let fence = self.read_fence()?;
        if token < fence {
            return Err(crate::refused(token, fence));
        }
        // The fence first: if the process dies between the two, lower tokens are refused
        // and the old contents stay, which is a state some holder could have produced.
        if token != fence {
            replace_file(&self.fence, token.to_string().as_bytes())?;
        }
        replace_file(&self.data, contents.as_ref())
    }

    /// [`FencedFile::claim`] on tokio's blocking pool: the runtime's threads never wait on the
    /// lock or on `fsync`.
    ///
    /// ```no_run
    /// # async fn job(token: u64) -> fencelock_core::Result<()> {
    /// use fencelock_fence::FencedFile;
    ///
    /// let report = FencedFile::new("/var/lib/export/last-run");
    /// let previous = report.claim_async(token).await?;
    /// let runs = previous.map_or(0, |p| String::from_utf8_lossy(&p).lines().count());
    /// report.write_async(token, format!("run {}\n", runs + 1)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`FencedFile::claim`]; [`Error::Store`] if the step panicked or
    /// the runtime shut down before it ran.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the step: it runs to the end on the blocking pool, so
    /// the claim may be recorded all the same.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn claim_async(&self, token: u64) -> Result<Option<Vec<u8>>> {
        self.off_runtime(move |file| file.claim(token)).await
    }

    /// [`FencedFile::write`] on tokio's blocking pool.
    ///
    /// # Errors
    /// As [`FencedFile::write`]; [`Error::Store`] if the step panicked or
    /// the runtime shut down before it ran.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the step: it runs to the end on the blocking pool, so
    /// the write may land all the same (only while the claim holds).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn write_async(&self, token: u64, contents: impl Into<Vec<u8>>) -> Result<()> {
        let contents = contents.into();
        self.off_runtime(move |file| file.write(token, contents))
            .await
    }

    /// [`FencedFile::replace`] on tokio's blocking pool.
    ///
    /// # Errors
    /// As [`FencedFile::replace`]; [`Error::Store`] if the step panicked or
    /// the runtime shut down before it ran.
    ///
    /// # Cancel safety
    /// Dropping the future does not stop the step: it runs to the end on the blocking pool, so
    /// the replacement may land all the same (only if no greater token claimed).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn replace_async(&self, token: u64, contents: impl Into<Vec<u8>>) -> Result<()> {
        let contents = contents.into();
        self.off_runtime(move |file| file.replace(token, contents))
            .await
    }

    async fn off_runtime<T: Send + 'static>(
        &self,
        step: impl FnOnce(&FencedFile) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let file = self.clone();
        tokio::task::spawn_blocking(move || step(&file))
            .await
            .map_err(|e| {
                let what = if e.is_panic() {
                    "panicked"
                } else {
                    "was cancelled (the runtime is shutting down)"
                };
                Error::store(format!("a step on {} {what}", self.data.display()), e)
            })?
    }

    /// The exclusive lock, held until the returned file is dropped (closing it releases it).
    fn lock(&self) -> Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)
            .map_err(|e| io_error("open the lock", &self.lock, e))?;
        loop {
            // SAFETY: flock(2) on a descriptor we own for the duration of the call.
            let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if result == 0 {
                return Ok(file);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(io_error("lock", &self.lock, error));
            }
        }
    }

    fn read_fence(&self) -> Result<u64> {
        match fs::read_to_string(&self.fence) {
            Ok(text) => text.trim().parse().map_err(|_| Error::Store {
                message: format!(
                    "{} holds {:?}, not a fencing token",
                    self.fence.display(),
                    text.chars().take(40).collect::<String>()
                ),
                source: None,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_error("read", &self.fence, e)),
        }
    }
}

/// Writes `contents` to a temporary file beside `path`, syncs it and renames it over `path`,
/// then syncs the directory so the rename survives a crash. Callers hold the lock, so one
/// temporary name per file is enough.
fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    let temporary = with_suffix(path, ".tmp");
    let write = || -> io::Result<()> {
        let mut file = File::create(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&temporary, path)?;
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(directory)?.sync_all()
    };
    write().map_err(|e| io_error("replace", path, e))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// Local I/O failures are not the store being away: retrying the same call rarely helps.
fn io_error(what: &str, path: &Path, error: io::Error) -> Error {
    Error::store(format!("{what} {}: {error}", path.display()), error)
}
