//! `lockctl run KEY… -- CMD`: the cron-job guard.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use fencelock::{
    DynLockStore, Error, KeepAlive, Lease, LockSetGuard, LockStoreExt, Mode, ReleaseOutcome,
};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::exit;
use crate::group::{self, Terminal};
use crate::guardian::Guardian;

/// What `run` acquires, and how long it gives the command's group after SIGTERM.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// The keys, in the command line's order: one, or several taken together (all or none).
    pub keys: &'a [String],
    /// The lease TTL.
    pub ttl: Duration,
    /// How long to wait for the key (`None` or zero: one attempt).
    pub wait: Option<Duration>,
    /// Exclusive, shared (`--shared`) or a permit (`--permits N`).
    pub mode: Mode,
    /// SIGTERM to SIGKILL.
    pub grace: Duration,
    /// The holder's label (`--label`, or `<host> pid <pid>`): what `lockctl status` shows,
    /// and an election's leader value.
    pub label: &'a str,
    /// An election (`lockctl elect`): wait for the key however long it takes when `wait` is
    /// `None`, and give the command `LOCK_LEADER_VALUE`.
    pub elect: bool,
}

/// `<host> pid <pid>`: the label of a lease that `--label` does not name.
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|host| host.trim().to_owned())
        .ok()
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host} pid {}", std::process::id())
}

/// Acquires `request.key` in `request.mode`, runs `command` in a process group of its own while keeping the lease alive,
/// and releases the lease once no process of that group runs any more.
///
/// `guardian` SIGKILLs the group if lockctl dies before it is told to stand down.
///
/// # Cancel safety
///
/// Not cancel safe: dropped while the command runs, the lease is neither kept alive nor
/// released (it expires at its TTL), the command gets SIGKILL (`kill_on_drop`), and its group
/// gets SIGKILL from the guardian once lockctl exits.
pub(crate) async fn run(
    store: DynLockStore,
    request: Request<'_>,
    command: Vec<OsString>,
    guardian: Guardian,
) -> ExitCode {
    let Request {
        keys,
        grace,
        label,
        elect,
        ..
    } = request;
    let held = match Held::acquire(&store, &request).await {
        Ok(held) => held,
        Err(error @ (Error::Busy { .. } | Error::WaitTimedOut { .. })) => {
            let busy = match &error {
                Error::Busy { key } | Error::WaitTimedOut { key, .. } => key.clone(),
                _ => unreachable!("matched above"),
            };
            let holder = match store.status(&busy).await {
                Ok(status) => format!(" ({})", crate::status::describe(&busy, &status)),
                Err(_) => String::new(),
            };
            eprintln!("lockctl: {error}{holder}");
            return ExitCode::from(exit::TEMPFAIL);
        }
        Err(error) => return crate::fail(&error),
    };
    let Some((program, args)) = command.split_first() else {
        let _ = held.release(&store).await;
        return crate::fail(&Error::invalid("command", "is missing after --"));
    };
    // Installed before the command starts, so a signal is never lost between the two.
    let Some(signals) = Signals::install() else {
        let _ = held.release(&store).await;
        eprintln!("lockctl: cannot install signal handlers");
        return ExitCode::from(exit::SOFTWARE);
    };
    let terminal = Terminal::take();
    let mut command = Command::new(program);
    command
        .args(args)
        .env_remove("LOCK_LEADER_VALUE")
        .kill_on_drop(true);
    if elect {
        command.env("LOCK_LEADER_VALUE", label);
    }
    held.env(&mut command, &store, keys);
    group::configure(&mut command, guardian.announce_fd(), terminal.as_ref());
    if let Some(code) = held.expired_before_start(&store).await {
        guardian.stand_down();
        drop(terminal);
        return ExitCode::from(code);
    }
    let spawned = command.spawn().and_then(|child| {
        match child.id().and_then(|id| libc::pid_t::try_from(id).ok()) {
            Some(pid) => Ok((child, pid)),
            None => Err(std::io::Error::other("the command has no pid")),
        }
    });
    let (child, pgid) = match spawned {
        Ok(spawned) => spawned,
        Err(error) => {
            // The command never reached exec, so its group died with it.
            guardian.stand_down();
            drop(terminal);
            let _ = held.release(&store).await;
            eprintln!("lockctl: cannot run {}: {error}", program.to_string_lossy());
            let code = if error.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return ExitCode::from(code);
        }
    };
    let guarded = Guarded {
        child,
        pgid,
        guardian,
        terminal,
    };
    let kept = held.keep_alive(&store);
    supervise(store, kept, guarded, signals, grace).await
}

/// The running command and what must outlive it until its group is empty.
struct Guarded {
    child: Child,
    /// The command's pid, which is its process group's id.
    pgid: libc::pid_t,
    guardian: Guardian,
    terminal: Option<Terminal>,
}

impl Guarded {
    /// Ends whatever of the group still runs (SIGTERM, SIGKILL after `grace`), then stands the
    /// guardian down and takes the terminal back: afterwards nothing of the command runs.
    async fn end(mut self, grace: Duration) {
        group::terminate(&mut self.child, self.pgid, grace).await;
        self.guardian.stand_down();
        drop(self.terminal);
    }
}

/// The signals lockctl passes on to the command's group.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
    /// SIGCHLD: the command may have been stopped by the terminal.
    child: Signal,
}

impl Signals {
    fn install() -> Option<Signals> {
        Some(Signals {
            interrupt: signal(SignalKind::interrupt()).ok()?,
            terminate: signal(SignalKind::terminate()).ok()?,
            hangup: signal(SignalKind::hangup()).ok()?,
            child: signal(SignalKind::child()).ok()?,
        })
    }
}

/// What the command runs under: one lease, or a set of keys taken together.
enum Held {
    One(Lease),
    Set(LockSetGuard),
}

/// [`Held`] once its keep-alive runs: a set keeps its keys alive from the moment it has them.
enum Kept {
    One(KeepAlive),
    Set(LockSetGuard),
}

impl Held {
    /// Takes the request's keys: one lease, or every key of several or none.
    async fn acquire(store: &DynLockStore, request: &Request<'_>) -> Result<Held, Error> {
        match request.keys {
            [key] => acquire(store, key, request).await.map(Held::One),
            keys => store
                .lock_all(keys)
                .ttl(request.ttl)
                .wait(request.wait.unwrap_or_default())
                .mode(request.mode)
                .label(request.label)
                .await
                .map(Held::Set),
        }
    }

    /// Gives the keys back (before the command ran).
    async fn release(self, store: &DynLockStore) -> Result<ReleaseOutcome, Error> {
        match self {
            Held::One(lease) => store.release(&lease).await,
            Held::Set(set) => set.release().await,
        }
    }

    /// The command's environment: `LOCK_KEY` and `LOCK_FENCING_TOKEN` for one key (and what
    /// the store's own lock tool gives its command, `etcdctl lock`'s say, so its scripts run
    /// unchanged); `LOCK_KEY_<i>` and `LOCK_FENCING_TOKEN_<i>` for every key, `i` its place
    /// on the command line from 0, and `LOCK_KEYS`, their number; the mode's variables.
    fn env(&self, command: &mut Command, store: &DynLockStore, keys: &[String]) {
        // Another lockctl's variables, inherited, never reach the command.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("LOCK_KEY_")
                || name.starts_with("LOCK_FENCING_TOKEN_")
                || name.starts_with("LOCK_SLOT_")
            {
                command.env_remove(&*name);
            }
        }
        command
            .env_remove("LOCK_KEY")
            .env_remove("LOCK_FENCING_TOKEN");
        command.env("LOCK_KEYS", keys.len().to_string());
        let leases: Vec<&Lease> = match self {
            Held::One(lease) => {
                command
                    .env("LOCK_KEY", lease.key())
                    .env("LOCK_FENCING_TOKEN", lease.fencing_token().to_string());
                command.envs(store.lease_env(lease));
                vec![lease]
            }
            Held::Set(set) => set.leases().collect(),
        };
        for (i, key) in keys.iter().enumerate() {
            let Some(lease) = leases.iter().find(|lease| lease.key() == key) else {
                continue;
            };
            command.env(format!("LOCK_KEY_{i}"), key).env(
                format!("LOCK_FENCING_TOKEN_{i}"),
                lease.fencing_token().to_string(),
            );
            if let (Held::Set(_), Some(slot)) = (self, lease.slot()) {
                command.env(format!("LOCK_SLOT_{i}"), slot.to_string());
            }
        }
        if let Some(first) = leases.first() {
            mode_env(command, first, matches!(self, Held::One(_)));
        }
    }

    /// The last check before the command starts: see [`expired_before_start`].
    async fn expired_before_start(&self, store: &DynLockStore) -> Option<u8> {
        match self {
            Held::One(lease) => expired_before_start(store, lease).await,
            Held::Set(set) => {
                for lease in set.leases() {
                    if let Some(code) = expired_before_start(store, lease).await {
                        return Some(code);
                    }
                }
                None
            }
        }
    }

    /// Starts keeping a single lease alive (a set already is).
    fn keep_alive(self, store: &DynLockStore) -> Kept {
        match self {
            Held::One(lease) => Kept::One(KeepAlive::start(store.clone(), lease)),
            Held::Set(set) => Kept::Set(set),
        }
    }
}

impl Kept {
    async fn lost(&self) {
        match self {
            Kept::One(held) => held.lost().await,
            Kept::Set(set) => set.lost().await,
        }
    }

    /// Why the lease (or a key of the set) is lost: "lost" once, then the store's error behind
    /// it (one level: a store error's message already names its client's error).
    fn why_lost(&self) -> String {
        let error = match self {
            Kept::One(held) => held.lost_error(),
            Kept::Set(set) => set.lost_error(),
        };
        error.map_or_else(
            || "the lease is lost".to_owned(),
            |error| match std::error::Error::source(&error) {
                Some(cause) => format!("{error}: {cause}"),
                None => error.to_string(),
            },
        )
    }

    /// Stops the keep-alive and releases; the keys, for a message.
    async fn release(self, store: &DynLockStore) -> (Result<ReleaseOutcome, Error>, String) {
        match self {
            Kept::One(held) => {
                let lease = held.stop().await;
                (store.release(&lease).await, format!("{:?}", lease.key()))
            }
            Kept::Set(set) => {
                let keys = set
                    .keys()
                    .map(|key| format!("{key:?}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                (set.release().await, keys)
            }
        }
    }
}

/// Waits for the command while keeping the lease alive; on loss ends its whole group. The lease
/// is released only once no process of the group runs.
async fn supervise(
    store: DynLockStore,
    held: Kept,
    mut guarded: Guarded,
    mut signals: Signals,
    grace: Duration,
) -> ExitCode {
    let pgid = guarded.pgid;
    let status = loop {
        tokio::select! {
            status = guarded.child.wait() => break status,
            () = held.lost() => {
                let why = crate::usage::one_line(&held.why_lost());
                eprintln!("lockctl: {why}; terminating the command");
                guarded.end(grace).await;
                let _ = held.release(&store).await;
                return ExitCode::from(exit::SOFTWARE);
            }
            // Passed on to the whole group; the lease is released once the group is gone.
            _ = signals.interrupt.recv() => group::signal(pgid, libc::SIGINT),
            _ = signals.terminate.recv() => group::signal(pgid, libc::SIGTERM),
            _ = signals.hangup.recv() => group::signal(pgid, libc::SIGHUP),
            // On a terminal, ^Z stops the command's group, which is the foreground: lockctl
            // stops with it, or the shell would never get the terminal back.
            _ = signals.child.recv() => {
                if let Some(terminal) = &guarded.terminal {
                    terminal.pass_on_stop(pgid);
                }
            }
        }
    };
    if group::is_alive(pgid) {
        eprintln!(
            "lockctl: the command exited and left processes in its process group; terminating them before the release"
        );
    }
    // Still under the kept-alive lease: left-over processes never run unguarded.
    guarded.end(grace).await;
    let (released, keys) = held.release(&store).await;
    let status = match status {
        Ok(status) => status,
        Err(error) => {
            eprintln!("lockctl: lost track of the command: {error}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    match released {
        Ok(ReleaseOutcome::Released) => ExitCode::from(code_of(status)),
        Ok(ReleaseOutcome::Lost) => {
            eprintln!(
                "lockctl: the lease on {keys} was already lost when the command ended; it may have overlapped another holder"
            );
            ExitCode::from(exit::SOFTWARE)
        }
        Err(error) => {
            // The command finished under a confirmed lease; the lock expires at its TTL.
            eprintln!(
                "lockctl: release failed ({}); the lock expires at its TTL",
                crate::usage::one_line(&error.to_string())
            );
            ExitCode::from(code_of(status))
        }
    }
}

/// `LOCK_MODE`, and for a permit `LOCK_PERMITS` and `LOCK_SLOT`; a `LOCK_PERMITS` or
/// `LOCK_SLOT` lockctl itself inherited (from an outer `lockctl run --permits`) is removed
/// when this lease has none, so the command never reads another lease's slot.
fn mode_env(command: &mut Command, lease: &Lease, one_key: bool) {
    command.env_remove("LOCK_PERMITS").env_remove("LOCK_SLOT");
    match lease.mode() {
        Mode::Exclusive => {
            command.env("LOCK_MODE", "exclusive");
        }
        Mode::Shared => {
            command.env("LOCK_MODE", "shared");
        }
        Mode::Permit { limit } => {
            command
                .env("LOCK_MODE", "permit")
                .env("LOCK_PERMITS", limit.to_string());
            if let (true, Some(slot)) = (one_key, lease.slot()) {
                command.env("LOCK_SLOT", slot.to_string());
            }
        }
        other => {
            command.env("LOCK_MODE", other.to_string());
        }
    }
}

/// The last check before the command starts: a lease whose local deadline has passed (a stall
/// between the store's reply and here) is released, and `run` exits 70 without starting the
/// command, which must assume the lease gone already.
async fn expired_before_start(store: &DynLockStore, lease: &Lease) -> Option<u8> {
    if !lease.is_expired() {
        return None;
    }
    let _ = store.release(lease).await;
    eprintln!(
        "lockctl: the lease on {:?} (fencing token {}) expired before the command could start; \
         the command did not run",
        lease.key(),
        lease.fencing_token()
    );
    Some(exit::SOFTWARE)
}

async fn acquire(store: &DynLockStore, key: &str, request: &Request<'_>) -> Result<Lease, Error> {
    let Request {
        ttl,
        wait,
        mode,
        label,
        elect,
        ..
    } = *request;
    // A campaign without a bound waits however long it takes: the longest wait, again.
    let forever = elect && wait.is_none();
    let wait = if forever {
        Some(fencelock::limits::MAX_WAIT)
    } else {
        wait
    };
    // No wait, or a zero one: one attempt; the request says which (`LockRequest::lease`).
    let asked = store
        .lock(key)
        .ttl(ttl)
        .wait(wait.unwrap_or_default())
        .mode(mode)
        .label(label);
    let waiting = async {
        loop {
            match asked.lease().await {
                Err(Error::WaitTimedOut { .. }) if forever => continue,
                result => return result,
            }
        }
    };
    if wait.is_none_or(|wait| wait.is_zero()) {
        return waiting.await;
    }
    if !std::io::stderr().is_terminal() {
        return waiting.await;
    }
    tokio::pin!(waiting);
    let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut holder = String::new();
    let mut ticks = 0usize;
    let result = loop {
        tokio::select! {
            result = &mut waiting => break result,
            _ = tick.tick() => {}
        }
        // Who holds it, refreshed once a second.
        if ticks.is_multiple_of(10) {
            if let Ok(status) = store.status(key).await {
                holder = crate::status::describe(key, &status);
            }
        }
        eprint!(
            "\r\x1b[2K{} waiting for {holder}",
            frames[ticks % frames.len()]
        );
        let _ = std::io::stderr().flush();
        ticks += 1;
    };
    eprint!("\r\x1b[2K");
    result
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
fn code_of(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use fencelock::MemoryStore;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_expired_before_the_command_starts_exits_70_and_frees_the_key() {
        let store: DynLockStore = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(3);
        let lease = store.try_acquire("k", ttl).await.unwrap();
        assert_eq!(expired_before_start(&store, &lease).await, None);
        // A stall of the whole local validity between the grant and the spawn.
        tokio::time::advance(ttl - fencelock::raw::drift(ttl)).await;
        assert_eq!(
            expired_before_start(&store, &lease).await,
            Some(exit::SOFTWARE)
        );
        // Released, not left to the store's TTL, which has not run out yet.
        let next = store.try_acquire("k", ttl).await.unwrap();
        assert!(next.fencing_token() > lease.fencing_token());
    }
}
