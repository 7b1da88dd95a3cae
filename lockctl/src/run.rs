//! `lockctl run KEY -- CMD`: the cron-job guard.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use fencelock::{DynLockStore, Error, KeepAlive, Lease, ReleaseOutcome};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

pub async fn run(
    store: DynLockStore,
    key: &str,
    ttl: Duration,
    wait: Option<Duration>,
    grace: Duration,
    command: Vec<OsString>,
) -> ExitCode {
    let lease = match acquire(&store, key, ttl, wait).await {
        Ok(lease) => lease,
        Err(error @ (Error::Busy { .. } | Error::WaitTimedOut { .. })) => {
            let holder = match store.status(key).await {
                Ok(status) => format!(" ({})", crate::status::describe(key, &status)),
                Err(_) => String::new(),
            };
            eprintln!("lockctl: {error}{holder}");
            return ExitCode::from(exit::TEMPFAIL);
        }
        Err(error) => return crate::fail(&error),
    };
    let Some((program, args)) = command.split_first() else {
        return crate::fail(&Error::invalid("command", "is missing after --"));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LOCK_KEY", key)
        .env("LOCK_FENCING_TOKEN", lease.fencing_token().to_string())
        .kill_on_drop(true);
    die_with_parent(&mut command);
    let child = command.spawn();
    let child = match child {
        Ok(child) => child,
        Err(error) => {
            let _ = store.release(&lease).await;
            eprintln!("lockctl: cannot run {}: {error}", program.to_string_lossy());
            let code = if error.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return ExitCode::from(code);
        }
    };
    supervise(store, lease, child, grace).await
}

/// Waits for the child while keeping the lease alive; on loss terminates the child.
async fn supervise(
    store: DynLockStore,
    lease: Lease,
    mut child: Child,
    grace: Duration,
) -> ExitCode {
    let held = KeepAlive::start(store.clone(), lease);
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => {
            eprintln!("lockctl: cannot install signal handlers");
            let _ = child.start_kill();
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = held.lost() => {
                eprintln!(
                    "lockctl: the lease on {:?} (fencing token {}) is lost: {}; terminating the command",
                    held.lease().key(),
                    held.lease().fencing_token(),
                    held.lost_reason().unwrap_or_default()
                );
                terminate_child(&mut child, grace).await;
                let _ = store.release(&held.stop()).await;
                return ExitCode::from(exit::SOFTWARE);
            }
            // Pass ^C and SIGTERM on; the lease is released once the command has exited.
            _ = interrupt.recv() => forward(&child, libc::SIGINT),
            _ = terminate.recv() => forward(&child, libc::SIGTERM),
        }
    };
    let lease = held.stop();
    let released = store.release(&lease).await;
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
                "lockctl: the lease on {:?} was already lost when the command ended; it may have overlapped another holder",
                lease.key()
            );
            ExitCode::from(exit::SOFTWARE)
        }
        Err(error) => {
            // The command finished under a confirmed lease; the lock expires at its TTL.
            eprintln!("lockctl: release failed ({error}); the lock expires at its TTL");
            ExitCode::from(code_of(status))
        }
    }
}

async fn acquire(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<Lease, Error> {
    let Some(wait) = wait else {
        return store.try_acquire(key, ttl).await;
    };
    let waiting = store.acquire(key, ttl, wait);
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

fn forward(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}

/// If lockctl itself is killed (`kill -9`, OOM), nothing is left to end the command when the
/// lease runs out, so the kernel kills it (Linux parent-death signal): a command never runs on
/// unguarded after its guard is gone.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut Command) {}

/// SIGTERM, then SIGKILL after `grace`.
async fn terminate_child(child: &mut Child, grace: Duration) {
    forward(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
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
