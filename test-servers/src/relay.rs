//! A TCP relay on a free loopback port that can be frozen, to cut one client off from a server
//! while the server and every other client go on.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::Result;

/// How often a frozen pump looks whether it was thawed.
const FROZEN_POLL: Duration = Duration::from_millis(5);

/// A TCP relay between clients and one upstream address (`host:port`), on a free port of
/// 127.0.0.1.
///
/// While [frozen](FreezableRelay::freeze) it moves no bytes in either direction and opens no
/// upstream connection, as if the client's network dropped everything (connections are kept,
/// not reset: the client sees silence, the server sees an idle client). Bytes read just before
/// a freeze are held back until the thaw. Each accepted connection is pumped by two threads,
/// which end when either side closes.
///
/// Dropping the handle stops accepting; connections already relayed go on until they close.
#[derive(Debug)]
pub struct FreezableRelay {
    port: u16,
    upstream: String,
    frozen: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl FreezableRelay {
    /// Starts relaying connections to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let frozen = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let (gate, stop, target) = (frozen.clone(), stopped.clone(), upstream.to_string());
        thread::Builder::new()
            .name(format!("relay-{port}"))
            .spawn(move || accept_loop(listener, target, gate, stop))?;
        Ok(FreezableRelay {
            port,
            upstream: upstream.to_string(),
            frozen,
            stopped,
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
        self.frozen.store(frozen, Ordering::SeqCst);
    }

    /// Whether the relay is frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }
}

impl Drop for FreezableRelay {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.frozen.store(false, Ordering::SeqCst);
        // Wakes the accept loop so it sees the stop flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept_loop(
    listener: TcpListener,
    upstream: String,
    frozen: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
) {
    for client in listener.incoming() {
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let (upstream, frozen) = (upstream.clone(), frozen.clone());
        // A frozen relay must not even connect upstream, so connect in the connection's thread.
        let _ = thread::Builder::new()
            .name("relay-conn".into())
            .spawn(move || {
                wait_thawed(&frozen);
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let pair = client
                    .try_clone()
                    .and_then(|c| Ok((c, server.try_clone()?)));
                let Ok((client2, server2)) = pair else {
                    return;
                };
                let gate = frozen.clone();
                let up = thread::Builder::new()
                    .name("relay-up".into())
                    .spawn(move || pump(client2, server2, &gate));
                pump(server, client, &frozen);
                if let Ok(up) = up {
                    let _ = up.join();
                }
            });
    }
}

fn wait_thawed(frozen: &AtomicBool) {
    while frozen.load(Ordering::SeqCst) {
        thread::sleep(FROZEN_POLL);
    }
}

/// Copies `from` to `to` until either side closes, holding bytes back while frozen; then
/// shuts both down so the other direction's pump ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    let result: io::Result<()> = (|| loop {
        wait_thawed(frozen);
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        wait_thawed(frozen);
        to.write_all(&buf[..n])?;
    })();
    drop(result);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_relay_holds_bytes_until_the_thaw() {
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
}
