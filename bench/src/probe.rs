//! What a benchmark process costs, read from Linux's /proc: live heap bytes (through
//! [`CountingAllocator`]), resident memory, CPU time and TCP connections. Used by the scale
//! rows (client memory per held lease, a constant number of connections).

// Unsafe only for a global allocator; each block says why it is sound.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

/// The system allocator, counting the bytes live. Install it in a benchmark binary with
/// `#[global_allocator] static A: CountingAllocator = CountingAllocator;` and read
/// [`live_bytes`].
#[derive(Debug)]
pub struct CountingAllocator;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn count(bytes: isize) {
    LIVE.fetch_add(bytes, Ordering::Relaxed);
}

fn size(bytes: usize) -> isize {
    isize::try_from(bytes).unwrap_or(isize::MAX)
}

// SAFETY: every call is passed to `System` unchanged; the counter only adds up sizes.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            count(size(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            count(size(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        count(-size(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            count(size(new_size) - size(layout.size()));
        }
        p
    }
}

/// Bytes allocated and not freed since the start, where [`CountingAllocator`] is the global
/// allocator (0 otherwise).
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The process's resident set (`VmRSS` of /proc/self/status), in bytes; 0 where unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// CPU time of process `pid` ("self" for this one) so far: the sum of its threads' run times
/// in /proc/PID/task/*/schedstat. `None` where unreadable.
pub fn cpu_time(pid: &str) -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = task.ok()?.path().join("schedstat");
        // A thread may end between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(path) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// This process's established TCP connections to any of `ports` on the peer side: the socket
/// inodes among its open files, looked up in /proc/self/net/tcp and tcp6. `None` where /proc
/// cannot tell.
pub fn connections_to(ports: &[u16]) -> Option<usize> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd").ok()? {
        let Ok(target) = std::fs::read_link(fd.ok()?.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            inodes.insert(inode.to_owned());
        }
    }
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl local remote state tx:rx tr:when retrnsmt uid timeout inode
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let port = remote
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            // State 01: established.
            if *state == "01" && port.is_some_and(|p| ports.contains(&p)) && inodes.contains(*inode)
            {
                count += 1;
            }
        }
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_cpu_and_a_connection_it_opened() {
        assert!(rss_bytes() > 0);
        assert!(cpu_time("self").is_some_and(|t| t > Duration::ZERO));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(connections_to(&[port]), Some(0));
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let _server = listener.accept().expect("accept");
        assert_eq!(connections_to(&[port]), Some(1));
    }
}
