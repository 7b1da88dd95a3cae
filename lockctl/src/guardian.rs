//! The guardian: a small process that SIGKILLs the command's process group when `lockctl` dies,
//! however it dies (`kill -9`, the OOM killer, a panic).
//!
//! Why a separate process: nothing in `lockctl` runs after SIGKILL, and the kernel's parent-death
//! signal reaches only the direct child, never the processes it forks. Why end-of-file on a pipe
//! rather than `PR_SET_PDEATHSIG`: the kernel closes a dead process's descriptors whatever killed
//! it, while the parent-death signal fires when the forking *thread* exits, and the runtime's
//! threads are not ours to keep alive. Why not `PR_SET_CHILD_SUBREAPER`: it keeps orphans within
//! reach only while `lockctl` lives.
//!
//! The protocol on the pipe is 4-byte messages (one `write` each, so atomic):
//! - a positive number, the command's process group, written by the command itself between fork
//!   and exec ([`crate::group::configure`]), so the guardian knows the group before the command
//!   can fork, even if `lockctl` dies in the middle of the spawn;
//! - zero: stand down, the group is already gone ([`Guardian::stand_down`]);
//! - end of file: every writer is gone. The command's copy closes at exec, so this means
//!   `lockctl` died: the guardian SIGKILLs the group it was told of, if any, and exits.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The handle `lockctl` keeps on its guardian: the pipe's writing end and the guardian's pid.
#[derive(Debug)]
pub(crate) struct Guardian {
    pid: libc::pid_t,
    writer: File,
}

impl Guardian {
    /// Forks the guardian.
    ///
    /// # Safety
    ///
    /// The process must have one thread (call this before the async runtime starts): the forked
    /// guardian runs ordinary Rust code, which is only sound after forking a single thread.
    pub(crate) unsafe fn start() -> io::Result<Guardian> {
        let mut fds = [0; 2];
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let (reader, writer) = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
        // Close-on-exec on both: the command closes its copy of the writer at exec, so only
        // lockctl's copy keeps the pipe open. One thread, so nothing can fork in between.
        for fd in [&reader, &writer] {
            if libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                drop(writer);
                guard(reader)
            }
            pid => Ok(Guardian {
                pid,
                writer: File::from(writer),
            }),
        }
    }

    /// The descriptor the command writes its process group to before exec.
    pub(crate) fn announce_fd(&self) -> RawFd {
        self.writer.as_raw_fd()
    }

    /// Tells the guardian the command's group is gone, so it exits without signalling anything
    /// (the group's id could otherwise be reused by the time `lockctl` exits), and reaps it.
    /// Call only once the group is empty. Dropping the handle instead leaves the guardian to
    /// SIGKILL the group when `lockctl` exits.
    pub(crate) fn stand_down(self) {
        let mut writer = self.writer;
        // A guardian already gone is fine: there is nothing left for it to do.
        let _ = writer.write_all(&0i32.to_ne_bytes());
        drop(writer);
        // The guardian exits as soon as it reads the message and ignores the job-control stops,
        // so this wait is short.
        let mut status = 0;
        // SAFETY: waitpid on our own child, which nothing else reaps (tokio reaps only the
        // children it spawned).
        unsafe {
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}

/// The guardian's whole life. Never returns.
fn guard(reader: OwnedFd) -> ! {
    // SAFETY: plain syscalls on our own process.
    unsafe {
        // Out of lockctl's process group: a `kill -9 %1` from the shell, which signals lockctl's
        // group, must not take the guardian down together with lockctl.
        libc::setpgid(0, 0);
        // Signals meant for lockctl or its terminal are not for the guardian: only the pipe
        // decides when it acts.
        for signal in [
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    release_descriptors(reader.as_raw_fd());
    let mut reader = File::from(reader);
    let mut group: libc::pid_t = 0;
    let mut message = [0u8; 4];
    loop {
        match reader.read_exact(&mut message) {
            Ok(()) => match i32::from_ne_bytes(message) {
                0 => break,
                announced => group = announced,
            },
            // End of file (or a broken pipe): lockctl is gone, and so must the group be.
            Err(_) => {
                if group > 0 {
                    // SAFETY: kill(2) on the group the command announced.
                    unsafe {
                        libc::kill(-group, libc::SIGKILL);
                    }
                }
                break;
            }
        }
    }
    // SAFETY: _exit skips the parent's atexit handlers and buffers, which are not ours.
    unsafe { libc::_exit(0) }
}

/// Points stdin, stdout and stderr at /dev/null and closes every other inherited descriptor
/// but `keep`, so the guardian never holds a pipe that someone waits to see closed (a shell's
/// `$(lockctl ...)`, a test reading lockctl's output).
fn release_descriptors(keep: RawFd) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of our own process.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let open: Vec<RawFd> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if fd > 2 && fd != keep {
            // SAFETY: closing inherited descriptors nothing in the guardian uses (the directory
            // listing's own descriptor is already closed, so closing it again is a no-op).
            unsafe {
                libc::close(fd);
            }
        }
    }
}
