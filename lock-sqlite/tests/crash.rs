//! A host crash (power loss, kernel panic) loses the commits whose WAL was not yet `fsync`ed;
//! a crash of a process loses none. The store commits at `synchronous = NORMAL`, so a grant
//! whose token is its wall-clock reading is not synced, and one whose token ran ahead of the
//! clock is (the crate docs, "Crashes and the clock"). These tests simulate a host crash by
//! opening a copy of the files as they were at the last sync: the loss is real (the copy holds
//! an older fence than the tokens handed out), and the next token is still above every one.

mod support;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock_core::{LockStore, ReleaseOutcome};
use fencelock_sqlite::{crash_hooks, SqliteStore};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use support::Scratch;

const TTL: Duration = Duration::from_secs(10);
const BURST: usize = 50;

fn unix_micros() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_micros()).expect("micros fit")
}

/// A plain connection to the database, every commit synced.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .connect()
        .await
        .expect("raw connection")
}

/// Moves every commit into the database file and syncs it (`wal_checkpoint(TRUNCATE)`), then
/// copies the file into `to`: what a host crash keeps at least from this moment on.
async fn synced_copy(path: &Path, to: &Path) {
    let mut conn = raw(path).await;
    let (busy,): (i64,) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut conn)
        .await
        .expect("checkpoint");
    assert_eq!(busy, 0, "the checkpoint could not finish");
    conn.close().await.expect("close");
    std::fs::copy(path, to).expect("copy the database");
}

/// Copies the database and its WAL as they are now into `to` (and `to`-wal).
fn copy_with_wal(path: &Path, to: &Path) {
    std::fs::copy(path, to).expect("copy the database");
    let wal = |p: &Path| format!("{}-wal", p.display());
    std::fs::copy(wal(path), wal(to)).expect("copy the WAL");
}

/// The key's token in the lock table of the database at `path`.
async fn fence(path: &Path, key: &str) -> i64 {
    sqlx::query_scalar("SELECT token FROM fencelock_locks WHERE key = ?1")
        .bind(key.as_bytes())
        .fetch_one(&mut raw(path).await)
        .await
        .expect("the key's row")
}

async fn grant_and_release(store: &SqliteStore, key: &str) -> u64 {
    let lease = store.try_acquire(key, TTL).await.expect("grant");
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
    lease.fencing_token()
}

/// After the crash: the host boots again (every row's boot id is an earlier boot's, so the
/// holders the crash killed hold nothing), and a store on the copy hands out a token above
/// `handed_out`.
async fn next_token_is_above(copy: &Path, key: &str, handed_out: u64) {
    sqlx::query("UPDATE fencelock_locks SET boot_id = 'the boot that crashed'")
        .execute(&mut raw(copy).await)
        .await
        .expect("reboot");
    let store = support::store(copy).await;
    let next = store
        .try_acquire(key, TTL)
        .await
        .expect("grant after the crash");
    assert!(
        next.fencing_token() > handed_out,
        "token {} after the crash, {handed_out} handed out before it",
        next.fencing_token()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_crash_that_loses_grants_at_the_clock_leaves_the_next_token_above_them() {
    let dir = Scratch::new("crash-at-clock");
    let key = "crash:at-clock";
    let store = support::store(&dir.db()).await;
    grant_and_release(&store, key).await;
    let before_burst = dir.path().join("before-burst.db");
    synced_copy(&dir.db(), &before_burst).await;

    let syncs = crash_hooks::wal_syncs(&dir.db());
    let mut handed_out = 0;
    for _ in 0..BURST {
        handed_out = handed_out.max(grant_and_release(&store, key).await);
    }
    assert_eq!(
        crash_hooks::wal_syncs(&dir.db()),
        syncs,
        "grants at the clock synced the WAL"
    );

    // Nothing synced the burst (no checkpoint: a few dozen pages of WAL), so a host crash may
    // keep exactly the copy from before it.
    let kept = fence(&before_burst, key).await;
    assert!(
        u64::try_from(kept).unwrap() < handed_out,
        "the copy holds token {kept}: no loss to show"
    );
    next_token_is_above(&before_burst, key, handed_out).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_ahead_of_the_clock_survives_a_host_crash() {
    let dir = Scratch::new("crash-ahead");
    let key = "crash:ahead";
    let store = support::store(&dir.db()).await;
    grant_and_release(&store, key).await;
    // The fence an hour ahead of the clock, as after the wall clock stepped back by an hour.
    let ahead = unix_micros() + 3_600_000_000;
    sqlx::query("UPDATE fencelock_locks SET token = ?1 WHERE key = ?2")
        .bind(ahead)
        .bind(key.as_bytes())
        .execute(&mut raw(&dir.db()).await)
        .await
        .expect("set the fence ahead");
    let at_last_sync = dir.path().join("at-last-sync.db");
    synced_copy(&dir.db(), &at_last_sync).await;

    let syncs = crash_hooks::wal_syncs(&dir.db());
    let lease = store.try_acquire(key, TTL).await.expect("grant");
    let granted = lease.fencing_token();
    assert_eq!(granted, u64::try_from(ahead).unwrap() + 1);

    // A host crash now keeps what was synced: the files as they are if the grant synced the
    // WAL, the copy from before it otherwise.
    let crashed = dir.path().join("crashed.db");
    if crash_hooks::wal_syncs(&dir.db()) > syncs {
        copy_with_wal(&dir.db(), &crashed);
    } else {
        std::fs::copy(&at_last_sync, &crashed).expect("copy");
    }
    assert_eq!(
        fence(&crashed, key).await,
        i64::try_from(granted).unwrap(),
        "the grant ahead of the clock was not synced: a host crash loses it"
    );
    next_token_is_above(&crashed, key, granted).await;
}

/// Sets the key's fence an hour ahead of the clock through `path`, as
/// `a_grant_ahead_of_the_clock_survives_a_host_crash` does, so the next grant must sync.
async fn fence_an_hour_ahead(path: &Path, key: &str) -> i64 {
    let ahead = unix_micros() + 3_600_000_000;
    sqlx::query("UPDATE fencelock_locks SET token = ?1 WHERE key = ?2")
        .bind(ahead)
        .bind(key.as_bytes())
        .execute(&mut raw(path).await)
        .await
        .expect("set the fence ahead");
    ahead
}

/// A grant ahead of the clock through `opened` (a symlink, or a path through one) syncs the WAL
/// SQLite writes, the one beside `real`, the file the links resolve to.
async fn a_grant_ahead_syncs_the_real_wal(opened: &Path, real: &Path, key: &str) {
    let store = support::store(opened).await;
    grant_and_release(&store, key).await;
    let ahead = fence_an_hour_ahead(real, key).await;
    let syncs = crash_hooks::wal_syncs(real);
    let lease = store.try_acquire(key, TTL).await.expect("grant");
    assert_eq!(lease.fencing_token(), u64::try_from(ahead).unwrap() + 1);
    assert_eq!(
        crash_hooks::wal_syncs(real),
        syncs + 1,
        "the grant ahead of the clock did not sync {}-wal, the WAL SQLite wrote it to",
        real.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_ahead_of_the_clock_syncs_the_wal_of_a_symlinked_database() {
    let dir = Scratch::new("crash-symlinked-file");
    let target_dir = dir.path().join("elsewhere");
    std::fs::create_dir(&target_dir).expect("target directory");
    let real = target_dir.join("locks.db");
    let link = dir.db();
    std::os::unix::fs::symlink(&real, &link).expect("symlink the database file");
    // SQLite creates the file the link points to; the real WAL is beside it, not beside the link.
    a_grant_ahead_syncs_the_real_wal(&link, &real, "crash:symlinked-file").await;
    assert!(!Path::new(&format!("{}-wal", link.display())).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_ahead_of_the_clock_syncs_the_wal_in_a_symlinked_directory() {
    let dir = Scratch::new("crash-symlinked-dir");
    let target_dir = dir.path().join("elsewhere");
    std::fs::create_dir(&target_dir).expect("target directory");
    let linked_dir = dir.path().join("linked");
    std::os::unix::fs::symlink(&target_dir, &linked_dir).expect("symlink the directory");
    a_grant_ahead_syncs_the_real_wal(
        &linked_dir.join("locks.db"),
        &target_dir.join("locks.db"),
        "crash:symlinked-dir",
    )
    .await;
}
