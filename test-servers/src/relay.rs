//! A TCP relay on a free loopback port that can be frozen, delayed or severed, to cut one
//! client off from a server (or one ZooKeeper member from the quorum) while the server and
//! every other client go on.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::Result;

/// How often a frozen pump looks whether it was thawed.
const FROZEN_POLL: Duration = Duration::from_millis(5);
/// How often a patient relay tries a refused upstream again: on loopback a server that is
/// about to listen does so within milliseconds.
const UPSTREAM_RETRY: Duration = Duration::from_millis(5);

/// A TCP relay between clients and one upstream address (`host:port`), on a free port of
/// 127.0.0.1.
///
/// While [frozen](FreezableRelay::freeze) it moves no bytes in either direction and opens no
/// upstream connection, as if the client's network dropped everything (connections are kept,
/// not reset: the client sees silence, the server sees an idle client). Bytes read just before
/// a freeze are held back until the thaw. With a [delay](FreezableRelay::set_delay) every
/// byte is passed on that long after it was read, in order, as over a slow link. Once
/// [severed](FreezableRelay::sever) it resets every connection and every new one. Each
/// accepted connection is pumped by two threads per direction, which end when either side
/// closes.
///
/// [`start_patient`](FreezableRelay::start_patient) keeps a connection whose upstream refuses
/// and tries again while the client stays connected.
///
/// Dropping the handle stops accepting; connections already relayed go on until they close.
#[derive(Debug)]
pub struct FreezableRelay {
    port: u16,
    upstream: String,
    links: Arc<Links>,
}

/// What every connection of one relay shares.
#[derive(Debug, Default)]
struct Links {
    frozen: AtomicBool,
    stopped: AtomicBool,
    severed: AtomicBool,
    /// Whether a refused upstream connect is tried again while the client stays connected.
    patient: AtomicBool,
    /// The delay, in ns, each byte waits after it was read.
    delay_ns: AtomicU64,
    /// Both sockets of each live connection, by a number of its own, so a sever can reset them.
    live: Mutex<HashMap<u64, (TcpStream, TcpStream)>>,
    next_id: AtomicU64,
}

impl Links {
    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns.load(Ordering::SeqCst))
    }

    fn wait_thawed(&self) {
        while self.frozen.load(Ordering::SeqCst) {
            thread::sleep(FROZEN_POLL);
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (TcpStream, TcpStream)>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FreezableRelay {
    /// Starts relaying connections to `upstream` (`host:port`). A connection whose upstream
    /// refuses it is closed at once.
    pub fn start(upstream: &str) -> Result<Self> {
        Self::start_with(upstream, false)
    }

    /// Starts relaying connections to `upstream`, keeping a connection whose upstream refuses
    /// it and trying again every few milliseconds until the upstream accepts or the client
    /// goes: what a client that retries a refused connect sees of a server not listening yet.
    /// A ZooKeeper follower retries a leader that refuses it, but gives up on one whose
    /// connection closes, and the leader then waits out `initLimit` for it.
    pub fn start_patient(upstream: &str) -> Result<Self> {
        Self::start_with(upstream, true)
    }

    fn start_with(upstream: &str, patient: bool) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let links = Arc::new(Links::default());
        links.patient.store(patient, Ordering::SeqCst);
        let (shared, target) = (links.clone(), upstream.to_string());
        thread::Builder::new()
            .name(format!("relay-{port}"))
            .spawn(move || accept_loop(listener, target, shared))?;
        Ok(FreezableRelay {
            port,
            upstream: upstream.to_string(),
            links,
        })
    }

    /// The relay's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, to put in a client's URL in place of the upstream address.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The address relayed to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Freezes (`true`) or thaws (`false`) every connection through the relay.
    pub fn freeze(&self, frozen: bool) {
        self.links.frozen.store(frozen, Ordering::SeqCst);
    }

    /// Whether the relay is frozen.
    pub fn is_frozen(&self) -> bool {
        self.links.frozen.load(Ordering::SeqCst)
    }

    /// Passes every byte read from now on `delay` after it was read, in both directions, in
    /// order (zero: at once). Bytes already read keep the delay they were read with.
    pub fn set_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.links.delay_ns.store(ns, Ordering::SeqCst);
    }

    /// Resets every connection through the relay, and from now on every new one as soon as it
    /// is accepted: the client sees its connection end at once, where a frozen relay makes it
    /// wait out its own timeout. Bytes not yet passed on are dropped.
    pub fn sever(&self) {
        self.links.severed.store(true, Ordering::SeqCst);
        for (client, server) in self.links.live().values() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for FreezableRelay {
    fn drop(&mut self) {
        self.links.stopped.store(true, Ordering::SeqCst);
        self.links.frozen.store(false, Ordering::SeqCst);
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept_loop(listener: TcpListener, upstream: String, links: Arc<Links>) {
    for client in listener.incoming() {
        if links.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if links.severed.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let (upstream, links) = (upstream.clone(), links.clone());
        // A frozen relay must not even connect upstream, so connect in the connection's thread.
        let _ = thread::Builder::new()
            .name("relay-conn".into())
            .spawn(move || relay_connection(client, &upstream, &links));
    }
}

/// Connects `client` to `upstream` once thawed and pumps both directions until either side
/// closes (or the relay is severed).
fn relay_connection(client: TcpStream, upstream: &str, links: &Arc<Links>) {
    let Some(server) = connect_upstream(&client, upstream, links) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let clones = || -> io::Result<_> {
        Ok((
            client.try_clone()?,
            server.try_clone()?,
            (client.try_clone()?, server.try_clone()?),
        ))
    };
    let Ok((client2, server2, tracked)) = clones() else {
        return;
    };
    let id = links.next_id.fetch_add(1, Ordering::SeqCst);
    links.live().insert(id, tracked);
    // A sever between the flag's check in the accept loop and the insert above.
    if links.severed.load(Ordering::SeqCst) {
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    }
    let gate = links.clone();
    let up = thread::Builder::new()
        .name("relay-up".into())
        .spawn(move || pump(client2, server2, &gate));
    pump(server, client, links);
    if let Ok(up) = up {
        let _ = up.join();
    }
    links.live().remove(&id);
}

/// Connects to `upstream` once thawed; a patient relay tries a refused connect again while
/// `client` stays connected and the relay is neither stopped nor severed.
fn connect_upstream(client: &TcpStream, upstream: &str, links: &Links) -> Option<TcpStream> {
    loop {
        links.wait_thawed();
        match TcpStream::connect(upstream) {
            Ok(server) => return Some(server),
            Err(_) if links.patient.load(Ordering::SeqCst) => {
                let ended = links.stopped.load(Ordering::SeqCst)
                    || links.severed.load(Ordering::SeqCst)
                    || !still_connected(client);
                if ended {
                    return None;
                }
                thread::sleep(UPSTREAM_RETRY);
            }
            Err(_) => return None,
        }
    }
}

/// Whether `client` has not closed its side (a peek that would block, or finds bytes).
fn still_connected(client: &TcpStream) -> bool {
    if client.set_nonblocking(true).is_err() {
        return false;
    }
    let connected = match client.peek(&mut [0u8; 1]) {
        Ok(n) => n > 0,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    };
    client.set_nonblocking(false).is_ok() && connected
}

/// Copies `from` to `to` until either side closes: a reader that stamps each chunk with the
/// moment it may be written (its read plus the relay's delay), and this thread, which writes
/// the chunks in order once due and thawed. Then shuts both down so the other direction's
/// pump ends too.
fn pump(from: TcpStream, mut to: TcpStream, links: &Arc<Links>) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let (mut source, gate) = match from.try_clone() {
        Ok(source) => (source, links.clone()),
        Err(_) => return,
    };
    let reader = thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                gate.wait_thawed();
                match source.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let at = Instant::now() + gate.delay();
                        if chunks.send((at, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    for (at, chunk) in due {
        let wait = at.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            thread::sleep(wait);
        }
        links.wait_thawed();
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    if let Ok(reader) = reader {
        let _ = reader.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port: its `host:port`.
    fn echo_server() -> String {
        let echo = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let upstream = echo.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for conn in echo.incoming().flatten() {
                let mut reader = conn.try_clone().unwrap();
                let mut writer = conn;
                thread::spawn(move || {
                    let _ = io::copy(&mut reader, &mut writer);
                });
            }
        });
        upstream
    }

    #[test]
    fn a_frozen_relay_holds_bytes_until_the_thaw() {
        let upstream = echo_server();
        let relay = FreezableRelay::start(&upstream).unwrap();
        let mut client = TcpStream::connect(relay.address()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");

        relay.freeze(true);
        client.write_all(b"held").unwrap();
        let err = client.read(&mut got).unwrap_err();
        assert!(matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
        relay.freeze(false);
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"held");
    }

    /// An upstream that starts listening only after the client connected: a patient relay
    /// passes the client's bytes on once it listens, a plain one closes the client at once.
    #[test]
    fn a_patient_relay_waits_for_an_upstream_that_listens_late() {
        let free = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let upstream = free.local_addr().unwrap().to_string();
        drop(free);
        let plain = FreezableRelay::start(&upstream).unwrap();
        let patient = FreezableRelay::start_patient(&upstream).unwrap();
        let mut refused = TcpStream::connect(plain.address()).unwrap();
        let mut client = TcpStream::connect(patient.address()).unwrap();
        for c in [&refused, &client] {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        client.write_all(b"late").unwrap();
        let mut got = [0u8; 4];
        assert_eq!(
            refused.read(&mut got).unwrap_or(0),
            0,
            "the plain relay closes"
        );

        thread::sleep(Duration::from_millis(100));
        let echo = TcpListener::bind(&upstream).unwrap();
        thread::spawn(move || {
            for conn in echo.incoming().flatten() {
                let mut reader = conn.try_clone().unwrap();
                let mut writer = conn;
                thread::spawn(move || {
                    let _ = io::copy(&mut reader, &mut writer);
                });
            }
        });
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"late");
    }

    /// Each byte crosses the relay twice on its way back from the echo server, so it returns
    /// no sooner than two delays after it was sent, and the bytes keep their order.
    #[test]
    fn a_delayed_relay_passes_bytes_in_order_after_the_delay() {
        let relay = FreezableRelay::start(&echo_server()).unwrap();
        let delay = Duration::from_millis(100);
        relay.set_delay(delay);
        let mut client = TcpStream::connect(relay.address()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let sent_at = Instant::now();
        client.write_all(b"one").unwrap();
        client.write_all(b"two").unwrap();
        let mut got = [0u8; 6];
        client.read_exact(&mut got).unwrap();
        assert!(sent_at.elapsed() >= delay * 2, "{:?}", sent_at.elapsed());
        assert_eq!(&got, b"onetwo");
    }

    #[test]
    fn a_severed_relay_resets_its_connections_and_every_new_one() {
        let relay = FreezableRelay::start(&echo_server()).unwrap();
        let mut client = TcpStream::connect(relay.address()).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        client.read_exact(&mut got).unwrap();
        relay.sever();
        // The live connection ends (EOF or a reset), and so does the next one: neither waits
        // out the read timeout.
        let ended = |read: io::Result<usize>| match read {
            Ok(0) => true,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            ),
            Ok(_) => false,
        };
        assert!(ended(client.read(&mut got)));
        let mut next = TcpStream::connect(relay.address()).unwrap();
        next.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = next.write_all(b"ping");
        assert!(ended(next.read(&mut got)));
    }
}
