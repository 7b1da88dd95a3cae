//! The README's shell job ("From the shell: `lockctl run` and `psql`"), run exactly as the
//! README shows it, under the built `lockctl` against a real PostgreSQL started by
//! test-servers: the lock on the `postgres://` store, the counter in a database of the same
//! server, `psql` from the `postgresql` package.
//!
//! The stale-holder case is driven step by step, never by timing: a `psql` shim on the first
//! job's `PATH` holds its second call (the write) until the test lets it go.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn server_url() -> String {
    test_servers::shared::postgres().url()
}

/// The job script: the `sh` block of the README's "From the shell" subsection.
fn readme_job() -> &'static str {
    let readme = include_str!("../../docs/fencing.md");
    let start = readme
        .find("### From the shell: `lockctl run` and `psql`")
        .expect("the README's shell fencing example");
    let rest = &readme[start..];
    let block = &rest[rest.find("```sh\n").expect("an sh block") + "```sh\n".len()..];
    let job = &block[..block.find("```").expect("a closed block")];
    assert!(job.contains("LOCK_FENCING_TOKEN"), "{job}");
    job
}

/// The real `psql`, found on `PATH`.
fn real_psql() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("psql"))
                .find(|candidate| candidate.is_file())
        })
        .expect(
            "psql not found on PATH: install the Debian package postgresql (scripts/test.sh does)",
        )
}

fn psql(database_url: &str, sql: &str) -> String {
    let output = Command::new(real_psql())
        .args([database_url, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

struct Setup {
    dir: PathBuf,
    job: PathBuf,
    lock_url: String,
    database_url: String,
}

/// A scratch directory with the README's job in `counter-job.sh`, and a fresh database
/// `name` holding the README's `counters` table with row 1 at 0.
fn setup(name: &str) -> Setup {
    let lock_url = server_url();
    psql(&lock_url, &format!("CREATE DATABASE {name}"));
    // The same server, another database: the path is the URL's last segment.
    let (server, _) = lock_url.rsplit_once('/').expect("a URL with a database");
    let database_url = format!("{server}/{name}");
    psql(
        &database_url,
        "CREATE TABLE counters (
           id    bigint PRIMARY KEY,
           value bigint NOT NULL,
           fence bigint NOT NULL DEFAULT 0
         );
         INSERT INTO counters (id, value) VALUES (1, 0);",
    );
    let dir = std::env::temp_dir().join(format!("lockctl-fencing-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let job = dir.join("counter-job.sh");
    std::fs::write(&job, readme_job()).expect("write the job");
    Setup {
        dir,
        job,
        lock_url,
        database_url,
    }
}

impl Setup {
    /// `lockctl run KEY <args> -- sh counter-job.sh`, as the README runs it.
    fn run(&self, key: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
        command
            .env("LOCK_URL", &self.lock_url)
            .env("DATABASE_URL", &self.database_url)
            .args(["run", key])
            .args(args)
            .arg("--")
            .arg("sh")
            .arg(&self.job);
        command
    }

    fn counter(&self) -> (i64, i64) {
        let row = psql(
            &self.database_url,
            "SELECT value || ' ' || fence FROM counters WHERE id = 1",
        );
        let (value, fence) = row.split_once(' ').expect("value and fence");
        (value.parse().expect("value"), fence.parse().expect("fence"))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn readme_job_under_lockctl_counts_every_run() {
    let setup = setup("fencing_counts");
    for _ in 0..2 {
        let output = setup
            .run("fencing-counts", &["--ttl", "10s"])
            .output()
            .expect("lockctl runs");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    }
    assert_eq!(setup.counter().0, 2);
}

#[test]
fn readme_job_refuses_to_claim_a_row_a_newer_token_claimed() {
    let setup = setup("fencing_claimed");
    psql(
        &setup.database_url,
        "UPDATE counters SET fence = 9223372036854775807 WHERE id = 1",
    );
    let output = setup
        .run("fencing-claimed", &["--ttl", "10s"])
        .output()
        .expect("lockctl runs");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is stale: claim refused"),
        "{}",
        stderr(&output)
    );
    assert_eq!(setup.counter().0, 0);
}

/// The issue's interleaving through `lockctl`: run A claims and reads, and its `lockctl` is
/// frozen past the TTL; run B takes the lock, claims and reads; A's job, still running, writes
/// with its old token; B writes. A's write is refused and every run that wrote is counted
/// (with a read that does not claim, both writes pass and one increment is lost).
#[test]
fn readme_job_whose_lease_was_taken_over_has_its_write_refused() {
    let setup = setup("fencing_stale");
    let shim = setup.dir.join("shim");
    std::fs::create_dir_all(&shim).expect("shim dir");
    let shim_psql = shim.join("psql");
    std::fs::write(
        &shim_psql,
        format!(
            "#!/bin/sh\n\
             # Holds the job's second psql call (its write) until the test creates `go`.\n\
             d=$PAUSE_DIR\n\
             n=$(cat \"$d/calls\" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > \"$d/calls\"\n\
             if [ $n = 2 ]; then : > \"$d/paused\"; while [ ! -e \"$d/go\" ]; do sleep 0.02; done; fi\n\
             exec {real} \"$@\"\n",
            real = real_psql().display(),
        ),
    )
    .expect("write the shim");
    std::fs::set_permissions(&shim_psql, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the shim");
    let path = format!(
        "{}:{}",
        shim.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (a_pause, b_pause) = (setup.dir.join("a"), setup.dir.join("b"));
    for dir in [&a_pause, &b_pause] {
        std::fs::create_dir_all(dir).expect("pause dir");
    }
    let spawn = |pause: &Path, args: &[&str]| {
        setup
            .run("fencing-stale", args)
            .env("PATH", &path)
            .env("PAUSE_DIR", pause)
            .stderr(Stdio::piped())
            .spawn()
            .expect("lockctl spawns")
    };

    // A claims and reads, then waits to write; its lockctl freezes past the TTL.
    let mut a = spawn(&a_pause, &["--ttl", "1s", "--grace", "1s"]);
    wait_for(&a_pause.join("paused"), &mut a);
    let a_job = child_of(a.id()).expect("A's job");
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(a.id() as libc::pid_t, libc::SIGSTOP) };

    // B takes the lock once A's lease is gone, claims and reads, then waits to write.
    let mut b = spawn(&b_pause, &["--ttl", "10s", "--wait", "60s"]);
    wait_for(&b_pause.join("paused"), &mut b);

    // A writes with its old token. Its lockctl is stopped, so the finished job stays a
    // zombie until it is resumed, and nothing stops it before its write.
    std::fs::write(a_pause.join("go"), "").expect("let A write");
    let started = Instant::now();
    while is_running(a_job) {
        assert!(started.elapsed() < LIMIT, "A's job never finished");
        std::thread::sleep(Duration::from_millis(20));
    }

    // B writes.
    std::fs::write(b_pause.join("go"), "").expect("let B write");
    let b = b.wait_with_output().expect("run B's output");
    assert_eq!(b.status.code(), Some(0), "run B: {}", stderr(&b));

    // SAFETY: as above.
    unsafe { libc::kill(a.id() as libc::pid_t, libc::SIGCONT) };
    let a = a.wait_with_output().expect("run A's output");
    let a_stderr = stderr(&a);
    assert_ne!(a.status.code(), Some(0), "run A: {a_stderr}");
    assert!(
        a_stderr.contains("is stale: write refused"),
        "run A: {a_stderr}"
    );
    assert_eq!(setup.counter().0, 1, "one run wrote, so one increment");
}

/// Waits until `path` exists; fails at once if `child` exits first.
fn wait_for(path: &Path, child: &mut Child) {
    let started = Instant::now();
    while !path.exists() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!(
                "lockctl exited ({status}) before {} appeared",
                path.display()
            );
        }
        assert!(
            started.elapsed() < LIMIT,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of the job (`sh …`) that `lockctl run` process `parent` started.
fn child_of(parent: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The parent's pid is the second field after the parenthesised command name.
        let ppid: u32 = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
        // lockctl's other child is its guardian, which runs lockctl itself.
        let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let is_job = command.starts_with(b"sh\0");
        (ppid == parent && is_job).then_some(pid)
    })
}

/// Alive and not a zombie waiting to be reaped.
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}
