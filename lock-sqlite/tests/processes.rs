//! Several OS processes on one database file: the test binary runs itself again as the child
//! processes (see [`child`]), which hold locks, crash at a point a hook makes certain, or are
//! frozen past their TTL.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

mod support;

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use fencelock_core::{Error, LockStore, ReleaseOutcome};
use fencelock_sqlite::SqliteStore;
use sqlx::{Connection, SqliteConnection};
use support::Scratch;

const ROLE: &str = "LOCK_SQLITE_CHILD";
const DB: &str = "LOCK_SQLITE_DB";
const OUT: &str = "LOCK_SQLITE_OUT";
const KEY: &str = "shared-key";

/// Starts this test binary again as a child process in `role`.
fn spawn(role: &str, db: &Path, out: &Path) -> Child {
    Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(DB, db)
        .env(OUT, out)
        .spawn()
        .expect("the child process starts")
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the child did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text;
            }
        }
        assert!(
            started.elapsed() < limit,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        libc::kill(child.id() as libc::pid_t, signal);
    }
}

fn killed_by(status: ExitStatus, signal: i32) -> bool {
    std::os::unix::process::ExitStatusExt::signal(&status) == Some(signal)
}

/// Appends one line; `O_APPEND` writes of a line are atomic between processes.
fn append(path: &Path, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the log");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("append to the log");
}

/// Not a test: the child processes' entry point. Does nothing unless the test that started
/// the process set `LOCK_SQLITE_CHILD`.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let db = std::env::var(DB).expect("LOCK_SQLITE_DB");
    let out = std::env::var(OUT).expect("LOCK_SQLITE_OUT");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let code = runtime.block_on(run_child(&role, Path::new(&db), Path::new(&out)));
    std::process::exit(code);
}

async fn run_child(role: &str, db: &Path, out: &Path) -> i32 {
    let store = support::store(db).await;
    let ttl = Duration::from_secs(5);
    match role {
        // Twenty critical sections, each logged at its start and end with its token.
        "contend" => {
            for _ in 0..20 {
                let lease = store
                    .acquire(KEY, ttl, Duration::from_secs(60))
                    .await
                    .expect("acquire");
                append(out, &format!("start {}", lease.fencing_token()));
                tokio::time::sleep(Duration::from_millis(2)).await;
                append(out, &format!("end {}", lease.fencing_token()));
                assert_eq!(
                    store.release(&lease).await.expect("release"),
                    ReleaseOutcome::Released
                );
            }
            0
        }
        // Three leases, the last token written out, then a death inside the next commit.
        "die-in-commit" | "die-after-grant" => {
            let mut last = 0;
            for _ in 0..3 {
                let lease = store.try_acquire(KEY, ttl).await.expect("try_acquire");
                last = lease.fencing_token();
                let _ = store.release(&lease).await.expect("release");
            }
            append(out, &last.to_string());
            if role == "die-in-commit" {
                fencelock_sqlite::crash_hooks::kill_in_next_commit();
            } else {
                fencelock_sqlite::crash_hooks::kill_after_next_grant();
            }
            let _ = store.try_acquire(KEY, Duration::from_secs(1)).await;
            eprintln!("the crash hook did not fire");
            3
        }
        // Holds a short lease and writes its token; the test freezes it, takes the key after
        // the TTL and lets it go on: exit 0 if its extend then says the lease is lost.
        "frozen" => {
            let lease = store
                .try_acquire(KEY, Duration::from_millis(500))
                .await
                .expect("try_acquire");
            append(out, &lease.fencing_token().to_string());
            // Resumed, it goes on once the test holds the key.
            let go = out.with_extension("go");
            while !go.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            match store.extend(&lease).await {
                Err(Error::LeaseLost { .. }) => 0,
                other => {
                    eprintln!("the frozen holder's extend gave {other:?}");
                    1
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_in_four_processes_never_overlap_and_tokens_grow() {
    let dir = Scratch::new("processes");
    let log = dir.path().join("log");
    // The table exists before the children race to create it.
    drop(support::store(&dir.db()).await);
    let mut children: Vec<Child> = (0..4).map(|_| spawn("contend", &dir.db(), &log)).collect();
    for child in &mut children {
        let status = wait_exit(child, Duration::from_secs(120));
        assert!(status.success(), "a child failed: {status}");
    }
    let text = std::fs::read_to_string(&log).expect("the log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * 20 * 2, "{text}");
    let mut last = 0u64;
    for pair in lines.chunks(2) {
        let start: u64 = pair[0]
            .strip_prefix("start ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        let end: u64 = pair[1]
            .strip_prefix("end ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(start, end, "two holders overlapped:\n{text}");
        assert!(start > last, "tokens did not grow:\n{text}");
        last = start;
    }
}

async fn integrity(db: &Path) -> String {
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("a raw connection");
    sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await
        .expect("integrity_check")
}

/// Tokens follow the clock (fence scheme 3), which would hide a lost or reissued token: the
/// key's counter is put far ahead of it before a child runs, so only the counter orders them.
async fn put_the_counter_ahead_of_the_clock(db: &Path) {
    let store = support::store(db).await;
    let lease = store
        .try_acquire(KEY, Duration::from_secs(5))
        .await
        .expect("acquire");
    assert_eq!(
        store.release(&lease).await.expect("release"),
        ReleaseOutcome::Released
    );
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open");
    sqlx::query("UPDATE fencelock_locks SET token = ?1 WHERE key = ?2")
        .bind(1_i64 << 62)
        .bind(KEY.as_bytes())
        .execute(&mut conn)
        .await
        .expect("counter ahead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_inside_its_commit_leaves_the_database_intact_and_the_key_free() {
    let dir = Scratch::new("die-in-commit");
    let out = dir.path().join("token");
    put_the_counter_ahead_of_the_clock(&dir.db()).await;
    let mut child = spawn("die-in-commit", &dir.db(), &out);
    let status = wait_exit(&mut child, Duration::from_secs(60));
    assert!(
        killed_by(status, libc::SIGKILL),
        "the child was not killed: {status}"
    );
    let last: u64 = wait_for_file(&out, Duration::from_secs(1))
        .trim()
        .parse()
        .unwrap();

    assert_eq!(integrity(&dir.db()).await, "ok");
    let store = support::store(&dir.db()).await;
    // The acquire died uncommitted: the key is free at once, and tokens go on growing.
    let lease = store
        .try_acquire(KEY, Duration::from_secs(30))
        .await
        .expect("the key is free after a death inside the commit");
    assert!(
        lease.fencing_token() > last,
        "{} after {last}",
        lease.fencing_token()
    );
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_after_its_grant_holds_the_key_until_its_ttl_and_its_token_is_never_reissued(
) {
    let dir = Scratch::new("die-after-grant");
    let out = dir.path().join("token");
    put_the_counter_ahead_of_the_clock(&dir.db()).await;
    let mut child = spawn("die-after-grant", &dir.db(), &out);
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let died_at = Instant::now();
    assert!(
        killed_by(status, libc::SIGKILL),
        "the child was not killed: {status}"
    );
    let last: u64 = wait_for_file(&out, Duration::from_secs(1))
        .trim()
        .parse()
        .unwrap();

    assert_eq!(integrity(&dir.db()).await, "ok");
    let store = support::store(&dir.db()).await;
    // The dead holder's grant was committed: its 1 s lease holds the key until it expires.
    match store.try_acquire(KEY, Duration::from_secs(30)).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("the dead holder's committed lease did not hold the key: {other:?}"),
    }
    let lease = store
        .acquire(KEY, Duration::from_secs(30), Duration::from_secs(10))
        .await
        .expect("the key is free once the dead holder's TTL ran out");
    assert!(
        died_at.elapsed() <= Duration::from_secs(2),
        "{:?}",
        died_at.elapsed()
    );
    // The token the dead holder never saw (last + 1) is not handed out again.
    assert!(
        lease.fencing_token() > last + 1,
        "{} after {last} and an unseen {}",
        lease.fencing_token(),
        last + 1
    );
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_ttl_is_superseded_with_a_greater_token() {
    let dir = Scratch::new("frozen");
    let out = dir.path().join("token");
    let mut child = spawn("frozen", &dir.db(), &out);
    let frozen: u64 = wait_for_file(&out, Duration::from_secs(30))
        .trim()
        .parse()
        .unwrap();
    signal(&child, libc::SIGSTOP);
    let store: SqliteStore = support::store(&dir.db()).await;
    let lease = store
        .acquire(KEY, Duration::from_secs(30), Duration::from_secs(10))
        .await
        .expect("the frozen holder's key is free after its TTL");
    assert!(
        lease.fencing_token() > frozen,
        "{} after {frozen}",
        lease.fencing_token()
    );
    std::fs::write(out.with_extension("go"), "go").expect("the go file");
    signal(&child, libc::SIGCONT);
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert_eq!(
        status.code(),
        Some(0),
        "the resumed holder did not learn it lost the lease"
    );
    assert_eq!(
        store.release(&lease).await.unwrap(),
        ReleaseOutcome::Released
    );
}
