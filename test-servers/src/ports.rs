//! Loopback ports that refuse connections, for "unreachable store" tests.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

/// The sockets behind every port [`closed_ports`] handed out; never closed, so the ports stay
/// reserved until the test process ends.
static RESERVED: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());

/// `n` distinct loopback ports that refuse connections for as long as the test process runs.
///
/// Each port is held by a TCP socket bound to `127.0.0.1` that never listens: a connection to
/// it is refused at once (`ECONNREFUSED`), no other socket can bind or listen there (the socket
/// does not set `SO_REUSEADDR`), and the kernel never picks it as the source port of an
/// outgoing connection. A port that was merely free a moment ago (bound, read, released) could
/// be taken by a server another test starts meanwhile.
///
/// # Panics
///
/// If the system refuses a socket (out of file descriptors or ports): a test cannot go on
/// without one.
///
/// ```no_run
/// let [a, b, c] = test_servers::closed_ports(3)[..] else { unreachable!() };
/// let url = format!("redlock://127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}");
/// ```
pub fn closed_ports(n: usize) -> Vec<u16> {
    let mut reserved = RESERVED.lock().unwrap_or_else(PoisonError::into_inner);
    (0..n)
        .map(|_| {
            let (socket, port) = bound_socket()
                .unwrap_or_else(|e| panic!("cannot reserve a closed loopback port: {e}"));
            reserved.push(socket);
            port
        })
        .collect()
}

/// A TCP socket bound to an ephemeral port on 127.0.0.1, not listening, and that port.
fn bound_socket() -> io::Result<(OwnedFd, u16)> {
    // std binds only listeners, so the socket is made by hand.
    // SAFETY: socket(2) takes no pointers; a non-negative result is a descriptor we own.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut len = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_in and `len` its size.
    let bound = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if bound != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `addr` has room for `len` bytes, which getsockname(2) may overwrite.
    let named = unsafe {
        libc::getsockname(
            socket.as_raw_fd(),
            (&raw mut addr).cast::<libc::sockaddr>(),
            &mut len,
        )
    };
    if named != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((socket, u16::from_be(addr.sin_port)))
}
