//! The command's process group: everything the command starts (a shell's background jobs, a
//! pipeline's stages, `make`'s recipes) is in it, so signalling the group reaches all of it.
//!
//! What escapes: a process that leaves the group on purpose (`setsid`, a daemon's double fork
//! with a new session). Nothing here follows it.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use tokio::process::{Child, Command};

/// How often a terminating group is checked for members.
const POLL: Duration = Duration::from_millis(20);

/// Makes `command` the leader of a new process group, announced to the guardian on
/// `announce_fd` before exec, and the terminal's foreground group if `terminal` holds it.
pub(crate) fn configure(command: &mut Command, announce_fd: RawFd, terminal: Option<&Terminal>) {
    let foreground = terminal.map(|t| t.ttou_ignored);
    // SAFETY: between fork and exec in a multi-threaded process only async-signal-safe calls
    // are allowed; these are setpgid, getpid, write, tcsetpgrp, signal and nothing that
    // allocates.
    unsafe {
        command.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let group = libc::getpid().to_ne_bytes();
            // A dead guardian must fail the spawn with EPIPE, not kill us with SIGPIPE: a
            // command must never run without one.
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let written = libc::write(announce_fd, group.as_ptr().cast(), group.len());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if written != group.len() as isize {
                return Err(io::Error::last_os_error());
            }
            if let Some(ttou_ignored) = foreground {
                // lockctl ignores SIGTTOU while it hands the terminal over, and we inherited
                // that, so this call from a new (background) group is allowed.
                if libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if !ttou_ignored {
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                }
            }
            Ok(())
        });
    }
}

/// Sends `signal` to every process in `group`.
pub(crate) fn signal(group: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) on the group of the command we spawned; we stop signalling it once it is
    // empty, before its id can be reused.
    unsafe {
        libc::kill(-group, signal);
    }
}

/// Whether any process of `group` still runs (zombies, dead and waiting for their parent to
/// reap them, do not count).
pub(crate) fn is_alive(group: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the group has a member we may signal.
    if unsafe { libc::kill(-group, 0) } != 0 {
        return io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    }
    has_live_member(group)
}

/// The group has a member that is not a zombie. Zombies keep a group's id alive until their
/// parent reaps them, and an orphan's new parent may take its time.
#[cfg(target_os = "linux")]
fn has_live_member(group: libc::pid_t) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // No /proc to tell: kill(2) said there is a member.
        return true;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // After the parenthesised command name: state, ppid, pgrp.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let mut fields = rest.split(' ');
        let state = fields.next();
        let pgrp = fields
            .nth(1)
            .and_then(|pgrp| pgrp.parse::<libc::pid_t>().ok());
        pgrp == Some(group) && !matches!(state, Some("Z" | "X"))
    })
}

#[cfg(not(target_os = "linux"))]
fn has_live_member(_: libc::pid_t) -> bool {
    true
}

/// Ends the group: SIGTERM (and SIGCONT, so a stopped process gets it), then SIGKILL if anything
/// of it still runs after `grace`. Returns once the command is reaped and the group is empty.
///
/// # Cancel safety
///
/// Not cancel safe: dropped early, the group may still run, and nothing sends the SIGKILL.
pub(crate) async fn terminate(child: &mut Child, group: libc::pid_t, grace: Duration) {
    signal(group, libc::SIGTERM);
    signal(group, libc::SIGCONT);
    if tokio::time::timeout(grace, gone(child, group))
        .await
        .is_err()
    {
        signal(group, libc::SIGKILL);
        // SIGKILL cannot be caught; wait for the kernel to finish the job.
        gone(child, group).await;
    }
}

/// Waits until the command is reaped and no process of its group runs.
async fn gone(child: &mut Child, group: libc::pid_t) {
    let _ = child.wait().await;
    while is_alive(group) {
        tokio::time::sleep(POLL).await;
    }
}

/// The terminal handed to the command's group while it runs, given back on drop.
///
/// A command run from a shell expects to read the terminal and to get ^C from it; both go to
/// the terminal's foreground group, which is lockctl's until it hands it over.
#[derive(Debug)]
pub(crate) struct Terminal {
    own_group: libc::pid_t,
    /// Whether SIGTTOU was already ignored before we ignored it.
    ttou_ignored: bool,
}

impl Terminal {
    /// Takes the terminal if stdin is one and lockctl's group is its foreground group; `None`
    /// otherwise (no terminal, or lockctl runs in the background), and then nothing changes.
    ///
    /// While the value lives, SIGTTOU is ignored: lockctl, then in a background group, must be
    /// able to write its messages and take the terminal back.
    pub(crate) fn take() -> Option<Terminal> {
        // SAFETY: queries on our own process and stdin.
        unsafe {
            let own_group = libc::getpgrp();
            if libc::isatty(libc::STDIN_FILENO) != 1
                || libc::tcgetpgrp(libc::STDIN_FILENO) != own_group
            {
                return None;
            }
            let previous = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            Some(Terminal {
                own_group,
                ttou_ignored: previous == libc::SIG_IGN,
            })
        }
    }
}

impl Terminal {
    /// If the terminal stopped the command's group (^Z, or a read from the background), stops
    /// lockctl too, so the shell sees its job stopped and gets the terminal back; once the shell
    /// resumes lockctl, the group gets the terminal again (if lockctl's group has it) and
    /// SIGCONT. Call on SIGCHLD.
    pub(crate) fn pass_on_stop(&self, group: libc::pid_t) {
        // SAFETY: waitid with WSTOPPED and without WEXITED only reports a stop of our child
        // and never reaps it (tokio does); the rest are plain calls on our own process and
        // terminal, with SIGTTOU ignored.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let stopped = libc::waitid(
                libc::P_PID,
                group as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG,
            ) == 0
                && info.si_pid() == group;
            if !stopped {
                return;
            }
            libc::tcsetpgrp(libc::STDIN_FILENO, self.own_group);
            // Stops the whole process here; `fg` or `bg` in the shell continues it.
            libc::kill(libc::getpid(), libc::SIGTSTP);
            if libc::tcgetpgrp(libc::STDIN_FILENO) == self.own_group {
                libc::tcsetpgrp(libc::STDIN_FILENO, group);
            }
        }
        signal(group, libc::SIGCONT);
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // SAFETY: we ignore SIGTTOU, so taking the terminal back from a background group
        // cannot stop us; then the previous disposition (lockctl sets no handler) is restored.
        unsafe {
            libc::tcsetpgrp(libc::STDIN_FILENO, self.own_group);
            if !self.ttou_ignored {
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            }
        }
    }
}
