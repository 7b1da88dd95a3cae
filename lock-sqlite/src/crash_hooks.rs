//! Points where a test process kills itself with `SIGKILL`, so a crash test knows exactly
//! where the holder died. Compiled only with the `crash-hooks` feature; never enable it in a
//! program that holds real locks.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

static KILL_IN_COMMIT: AtomicBool = AtomicBool::new(false);
static KILL_AFTER_GRANT: AtomicBool = AtomicBool::new(false);
/// How many times acquires of this process synced each database's WAL themselves.
static WAL_SYNCS: Mutex<BTreeMap<PathBuf, u64>> = Mutex::new(BTreeMap::new());

/// How many times an acquire of this process has `fsync`ed the WAL of the database at
/// `database` itself: a token ahead of the clock. Both sides are resolved as the file system
/// resolves them (symlinks followed), so the count is of syncs of the WAL SQLite writes. A
/// crash test counts them: a copy of the files taken right after such a sync is what a host
/// crash keeps at least, and with no sync since a copy, no more than that copy.
pub fn wal_syncs(database: &Path) -> u64 {
    let Ok(database) = std::fs::canonicalize(database) else {
        return 0;
    };
    let mut wal = database.into_os_string();
    wal.push("-wal");
    let syncs = WAL_SYNCS.lock().unwrap_or_else(PoisonError::into_inner);
    syncs.get(Path::new(&wal)).copied().unwrap_or(0)
}

/// Called by the store after it synced the WAL file `wal` for a grant: counted under the file
/// it resolves to, and not at all if there is no such file (nothing was synced).
pub(crate) fn wal_synced(wal: &Path) {
    let Ok(wal) = std::fs::canonicalize(wal) else {
        return;
    };
    let mut syncs = WAL_SYNCS.lock().unwrap_or_else(PoisonError::into_inner);
    *syncs.entry(wal).or_default() += 1;
}

/// The next commit of any connection of this process kills the process inside the commit: the
/// statement has run, its transaction is not yet committed.
pub fn kill_in_next_commit() {
    KILL_IN_COMMIT.store(true, Ordering::SeqCst);
}

/// The next granted acquire kills the process after its commit, before the lease is built: the
/// token is committed but nobody ever sees it.
pub fn kill_after_next_grant() {
    KILL_AFTER_GRANT.store(true, Ordering::SeqCst);
}

fn kill_self() -> ! {
    // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught, so it does not return.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// Installs the commit hook on a new connection.
pub(crate) async fn install(conn: &mut sqlx::SqliteConnection) -> sqlx::Result<()> {
    let mut handle = conn.lock_handle().await?;
    handle.set_commit_hook(|| {
        if KILL_IN_COMMIT.load(Ordering::SeqCst) {
            kill_self();
        }
        true
    });
    Ok(())
}

/// Called by the store after a granted acquire's commit.
pub(crate) fn after_grant() {
    if KILL_AFTER_GRANT.load(Ordering::SeqCst) {
        kill_self();
    }
}
