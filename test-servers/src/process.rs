//! Plumbing shared by all servers: free ports, temporary directories, log
//! tails, finding binaries, spawning and signalling child processes, and
//! waiting until a server is ready.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How long a server may take to become ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times a start is tried on fresh ports when the server exits
/// early (typically because another process took the port meanwhile).
pub(crate) const START_ATTEMPTS: usize = 3;

/// `n` distinct free TCP ports on 127.0.0.1, reserved for this test process until it exits.
///
/// Between this call and the server's `listen`, and again while a test restarts a server on
/// its port, two things could take a port: an outgoing connection the kernel gives it as its
/// source port, and a server another test process starts (the test runner runs several test
/// binaries at once). So the ports come from below the kernel's ephemeral range
/// (`ip_local_port_range`), which it never hands out as source ports, and each is claimed by an
/// exclusive `flock` on a file named after it in a directory all test processes share, held
/// until this process exits: no two live test processes hold one port. A port is also checked
/// free by binding it (a server of something else may listen there).
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>> {
    let range = server_port_range()?;
    let dir = std::env::temp_dir().join("test-servers-ports");
    fs::create_dir_all(&dir)?;
    let mut claimed = CLAIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut ports = Vec::with_capacity(n);
    let span = u32::from(range.1 - range.0);
    for attempt in 0.. {
        if ports.len() == n {
            break;
        }
        if attempt > 50 * (n + 1) {
            return Err(Error::Io(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "no free port claimable in {}..{} after {attempt} tries",
                    range.0, range.1
                ),
            )));
        }
        let port = range.0 + (random_u32() % span) as u16;
        if ports.contains(&port) {
            continue;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))?;
        // SAFETY: flock(2) on a descriptor `file` owns; no pointers.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // Another live test process holds it (or this one does, on an older call).
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue; // Dropping `file` unlocks it.
        }
        claimed.push(file);
        ports.push(port);
    }
    Ok(ports)
}

/// The lock files behind every port [`free_ports`] claimed; never closed, so the claims hold
/// until the test process ends.
static CLAIMED: Mutex<Vec<fs::File>> = Mutex::new(Vec::new());

/// The ports servers are started on: from 10,000 to the start of the kernel's ephemeral range
/// (32,768 by default), or above its end when that start is too low to leave room.
fn server_port_range() -> Result<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    let (low, high) = match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) => (low, high),
        _ => (32_768, 60_999),
    };
    if low >= 12_000 {
        Ok((10_000, low))
    } else if high <= 63_000 {
        Ok((high + 1, u16::MAX))
    } else {
        Err(Error::Io(io::Error::other(format!(
            "the ephemeral port range {low}-{high} leaves no room for test servers' ports"
        ))))
    }
}

/// A random number from std's per-process random hash keys (no dependency for this).
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_usize(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.finish() as u32
}

/// Finds `binary` on `PATH`, or reports which Debian package provides it.
pub(crate) fn find_binary(binary: &str, package: &str) -> Result<PathBuf> {
    which(binary).ok_or_else(|| Error::MissingBinary {
        binary: binary.to_string(),
        package: package.to_string(),
    })
}

/// The first executable file called `binary` in `PATH`.
pub(crate) fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// True when running as root (effective uid 0).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A directory removed (recursively) on drop.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<base>/fencelock-<kind>-<pid>-<counter>-<port>` with mode 0755;
    /// `base` defaults to `std::env::temp_dir()`.
    pub(crate) fn new(kind: &str, port: u16, base: Option<&Path>) -> Result<Self> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
        fs::create_dir_all(&base)?;
        sweep_stale(&base);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!(
                "fencelock-{kind}-{}-{n}-{port}",
                std::process::id()
            ));
            match fs::create_dir(&path) {
                Ok(()) => {
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
                    return Ok(TempDir { path });
                }
                // A leftover of an earlier process with the same pid.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Once per process and base directory: removes `fencelock-*` directories
/// left behind by test processes that no longer exist (killed before their
/// `Drop` ran; their servers died with them).
fn sweep_stale(base: &Path) {
    static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
    if swept.iter().any(|b| b == base) {
        return;
    }
    swept.push(base.to_path_buf());
    for entry in fs::read_dir(base).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // fencelock-<kind>-<pid>-<counter>-<port>, where <kind> may hold dashes
        // (`etcd-tls`, `redis-cluster`): the pid is the third field from the end.
        let Some(rest) = name.strip_prefix("fencelock-") else {
            continue;
        };
        let Some(pid) = rest.rsplit('-').nth(2).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// The last lines of a log file (empty string if it cannot be read).
pub(crate) fn log_tail(log: &Path) -> String {
    const MAX_BYTES: u64 = 8 * 1024;
    const MAX_LINES: usize = 40;
    let Ok(mut file) = fs::File::open(log) else {
        return format!("(no log at {})", log.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(MAX_LINES)..].join("\n")
}

/// Appends a marker line to a log, so the tail shows which start it belongs to.
pub(crate) fn log_marker(log: &Path, what: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "==== test-servers: {what} ====");
    }
}

/// Builds an [`Error::Start`] with the tail of `log`.
pub(crate) fn start_error(server: &str, reason: impl Into<String>, log: &Path) -> Error {
    Error::Start {
        server: server.to_string(),
        reason: reason.into(),
        log_tail: log_tail(log),
    }
}

/// Runs a short-lived setup command (initdb, pg_ctl) to completion, with its
/// output appended to `log`; a failure is described in the error string.
pub(crate) fn run_logged(mut cmd: Command, log: &Path) -> std::result::Result<(), String> {
    let program = cmd.get_program().to_owned();
    let out = OpenOptions::new().create(true).append(true).open(log);
    let out = out.map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    match cmd.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("{program:?} failed ({status})")),
        Err(e) => Err(format!("cannot run {program:?}: {e}")),
    }
}

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from a helper thread that lives as long as the process, with
/// the parent-death signal set to SIGKILL: the child dies with this process
/// even if no `Drop` runs. (The signal fires when the *thread* that forked
/// exits, so it must not be a test thread.)
fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid is always safe.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure only makes async-signal-safe system calls.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    // The parent died before prctl took effect.
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("test-servers-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the test-servers spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the test-servers spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the test-servers spawner thread is gone"))?
}

/// A server process, leader of its own process group. Signals go to the group
/// and to every descendant, so they reach the server's own children too (e.g.
/// PostgreSQL backends, which start sessions of their own). Killed and reaped
/// on drop.
#[derive(Debug)]
pub(crate) struct Proc {
    child: Option<Child>,
    paused: AtomicBool,
}

impl Proc {
    /// A process slot with nothing running (after a kill, before a restart).
    pub(crate) fn none() -> Self {
        Proc {
            child: None,
            paused: AtomicBool::new(false),
        }
    }

    /// Spawns `cmd` with stdin from /dev/null and stdout+stderr appended to `log`.
    pub(crate) fn spawn(mut cmd: Command, log: &Path) -> Result<Self> {
        let out = OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let program = cmd.get_program().to_owned();
        let child = spawn_tied(cmd)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot spawn {program:?}: {e}")))?;
        Ok(Proc {
            child: Some(child),
            paused: AtomicBool::new(false),
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True until the process was killed (or was seen to have exited).
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.is_running() && self.paused.load(Ordering::SeqCst)
    }

    /// If the process has exited by itself, reaps it and returns its status.
    pub(crate) fn reap_if_exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Sends `sig` to the server's process group and to every descendant of
    /// the server (PostgreSQL backends run in sessions of their own).
    pub(crate) fn signal_tree(&self, sig: libc::c_int, what: &str) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::NotRunning(what.to_string()))?;
        // SAFETY: plain system call; the child is not reaped yet, so its pid
        // (and process group id) cannot have been reused.
        if unsafe { libc::kill(-(pid as libc::pid_t), sig) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        for d in descendants(pid) {
            // SAFETY: plain system call (the pid was a descendant a moment ago).
            unsafe { libc::kill(d as libc::pid_t, sig) };
        }
        Ok(())
    }

    /// Sends `sig` to the group leader only.
    pub(crate) fn signal_leader(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: as in `signal_tree`.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        }
    }

    /// SIGSTOP to the server and its descendants; returns once they are all
    /// stopped (signal delivery is asynchronous), or after 2 s at most.
    pub(crate) fn pause(&self, what: &str) -> Result<()> {
        self.signal_tree(libc::SIGSTOP, what)?;
        self.paused.store(true, Ordering::SeqCst);
        let pid = self
            .pid()
            .ok_or_else(|| Error::NotRunning(what.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut pids = descendants(pid);
        pids.push(pid);
        while !pids.iter().all(|&p| is_stopped_or_gone(p)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// SIGCONT to the server and its descendants.
    pub(crate) fn resume(&self, what: &str) -> Result<()> {
        self.signal_tree(libc::SIGCONT, what)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// SIGCONT if paused (so the server can handle a shutdown request).
    pub(crate) fn unpause(&self) {
        if self.is_paused() {
            let _ = self.signal_tree(libc::SIGCONT, "");
            self.paused.store(false, Ordering::SeqCst);
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; true if it did
    /// (it is then reaped).
    pub(crate) fn wait_timeout(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.as_mut().map(Child::try_wait) {
                None | Some(Ok(Some(_))) | Some(Err(_)) => {
                    self.child = None;
                    self.paused.store(false, Ordering::SeqCst);
                    return true;
                }
                Some(Ok(None)) if Instant::now() >= deadline => return false,
                Some(Ok(None)) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// SIGKILL to the server and all its descendants at once (works on
    /// stopped processes too), then reaps the server. Idempotent.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            // SAFETY: plain system calls; the child is not reaped yet. Stop
            // it first so that it forks no new children meanwhile.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
            let children = descendants(pid);
            // SAFETY: as above.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            for d in children {
                // SAFETY: as above.
                unsafe { libc::kill(d as libc::pid_t, libc::SIGKILL) };
            }
            let _ = child.wait();
        }
        self.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True if process `pid` is stopped, a zombie, or gone.
fn is_stopped_or_gone(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, None | Some("T" | "t" | "Z" | "X"))
}

/// All descendants of `pid` (children, grandchildren, ...), from `/proc`.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, p)| p == parent)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Polls `ready` until it returns true. Fails with the tail of `log` if the
/// process exits first or after [`READY_TIMEOUT`]; after an early exit
/// `proc.is_running()` is false, which callers use to retry on other ports.
pub(crate) fn wait_ready(
    proc: &mut Proc,
    what: &str,
    log: &Path,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(5);
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(status) = proc.reap_if_exited() {
            return Err(start_error(
                what,
                format!("it exited ({status}) before it was ready"),
                log,
            ));
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(start_error(
                what,
                format!("not ready after {READY_TIMEOUT:?}"),
                log,
            ));
        }
        thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ports are distinct, outside the kernel's ephemeral range, and claimed: another
    /// open of a port's lock file (as another test process would) cannot lock it.
    #[test]
    fn free_ports_are_distinct_outside_the_ephemeral_range_and_claimed() {
        let (low, high) = server_port_range().expect("a range");
        let ports = free_ports(20).expect("ports");
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20, "{ports:?}");
        let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").expect("range");
        let ephemeral: Vec<u16> = text
            .split_whitespace()
            .map(|n| n.parse().expect("a port"))
            .collect();
        for &port in &ports {
            assert!((low..high).contains(&port), "{port} outside {low}..{high}");
            assert!(
                !(ephemeral[0]..=ephemeral[1]).contains(&port),
                "{port} is in the ephemeral range {ephemeral:?}"
            );
            let other = OpenOptions::new()
                .write(true)
                .open(
                    std::env::temp_dir()
                        .join("test-servers-ports")
                        .join(port.to_string()),
                )
                .expect("the lock file");
            // SAFETY: flock(2) on a descriptor `other` owns.
            let locked = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            assert_ne!(locked, 0, "port {port} was not claimed");
        }
    }

    #[test]
    fn the_sweep_removes_directories_of_dead_processes_whatever_their_kind() {
        let base = std::env::temp_dir().join(format!("sweep-test-{}", std::process::id()));
        fs::create_dir_all(&base).expect("a base directory");
        let dead = (4_000_000..4_194_304)
            .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
            .expect("a pid no process has");
        let ours = std::process::id();
        let names = [
            format!("fencelock-etcd-{dead}-0-1"),
            format!("fencelock-etcd-tls-{dead}-1-2"),
            format!("fencelock-redis-cluster-{dead}-2-3"),
            format!("fencelock-etcd-tls-{ours}-3-4"),
        ];
        for name in &names {
            fs::create_dir_all(base.join(name)).expect("a directory");
        }
        sweep_stale(&base);
        let left: Vec<bool> = names.iter().map(|n| base.join(n).exists()).collect();
        let _ = fs::remove_dir_all(&base);
        assert_eq!(left, [false, false, false, true]);
    }
}
