//! `redis-server` on a free loopback port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{self, log_marker, wait_ready, Proc, TempDir};
use crate::{Error, Result};

const ENV_URL: &str = "LOCK_TEST_REDIS_URL";
/// The server binary to start instead of `redis-server` (see the crate docs).
const ENV_SERVER: &str = "LOCK_TEST_REDIS_SERVER";

/// The server binary: `LOCK_TEST_REDIS_SERVER`'s, or `redis-server` from `PATH`.
pub(crate) fn server_binary() -> Result<PathBuf> {
    match std::env::var_os(ENV_SERVER).filter(|path| !path.is_empty()) {
        Some(path) if process::is_executable(std::path::Path::new(&path)) => Ok(path.into()),
        Some(path) => Err(Error::NotExecutable {
            variable: ENV_SERVER,
            path: std::path::Path::new(&path).display().to_string(),
        }),
        None => process::find_binary("redis-server", "redis-server"),
    }
}

/// A Redis server for tests: a `redis-server` child process on a free port
/// of 127.0.0.1 without persistence (`--save "" --appendonly no`), or an
/// external server named by `LOCK_TEST_REDIS_URL`.
///
/// Dropping it kills the process and removes its temporary directory.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    url: String,
    local: Option<Local>,
}

#[derive(Debug)]
struct Local {
    // Dropped (killed) before `dir` is removed.
    proc: Proc,
    binary: PathBuf,
    /// Extra arguments after the defaults (later ones win in redis-server).
    args: Vec<String>,
    log: PathBuf,
    /// The wall clock a test steps while the server runs, if it was started with one.
    clock: Option<crate::ClockControl>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a fresh server and waits until it answers `PING` (or returns a
    /// handle to `LOCK_TEST_REDIS_URL` if that is set).
    ///
    /// Fails with [`Error::MissingBinary`] if `redis-server` is not installed.
    pub fn start() -> Result<Self> {
        match crate::external_url(ENV_URL) {
            Some(url) => Ok(RedisServer {
                port: crate::url_port(&url, 6379),
                url,
                local: None,
            }),
            None => Self::start_local(&[]),
        }
    }

    /// Starts `n` independent servers (masters, as Redlock needs), always
    /// local, whatever `LOCK_TEST_REDIS_URL` says.
    pub fn start_many(n: usize) -> Result<Vec<Self>> {
        (0..n).map(|_| Self::start_local(&[])).collect()
    }

    /// Starts a local server with extra command-line arguments after the
    /// defaults, such as `["--maxmemory", "8mb", "--maxmemory-policy",
    /// "volatile-lru"]` or `["--rename-command", "CONFIG", ""]`; always local,
    /// whatever `LOCK_TEST_REDIS_URL` says. [`restart`](Self::restart) keeps
    /// them.
    pub fn start_with_args(args: &[&str]) -> Result<Self> {
        Self::start_local(args)
    }

    /// Starts a local server whose wall clock (`TIME`, key expiry) a test steps while it runs
    /// with [`clock`](Self::clock) (the clock shim; its monotonic clock is left alone). Always
    /// local; kept across [`restart`](Self::restart).
    pub fn start_with_clock() -> Result<Self> {
        Self::start_local_with(&[], true)
    }

    /// The control of the server's wall clock, for a server from
    /// [`start_with_clock`](Self::start_with_clock).
    pub fn clock(&self) -> Option<&crate::ClockControl> {
        self.local.as_ref().and_then(|l| l.clock.as_ref())
    }

    fn start_local(args: &[&str]) -> Result<Self> {
        Self::start_local_with(args, false)
    }

    fn start_local_with(args: &[&str], clock: bool) -> Result<Self> {
        let binary = server_binary()?;
        let mut last_error = None;
        for _ in 0..process::START_ATTEMPTS {
            let port = process::free_ports(1)?[0];
            let dir = TempDir::new("redis", port, None)?;
            let log = dir.path().join("redis.log");
            let mut local = Local {
                proc: Proc::none(),
                binary: binary.clone(),
                args: args.iter().map(|a| a.to_string()).collect(),
                log,
                clock: clock.then(crate::ClockControl::new).transpose()?,
                dir,
            };
            match local.launch(port) {
                Ok(()) => {
                    return Ok(RedisServer {
                        port,
                        url: format!("redis://127.0.0.1:{port}"),
                        local: Some(local),
                    })
                }
                // Exited early: most likely the port was taken meanwhile.
                Err(e) if !local.proc.is_running() => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// The URL to connect to: `redis://127.0.0.1:PORT` (or the external URL).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True if this handle points at a server given by `LOCK_TEST_REDIS_URL`
    /// (no process of ours; fault injection is unsupported).
    pub fn is_external(&self) -> bool {
        self.local.is_none()
    }

    /// The server's process id, `None` if external or killed.
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.proc.pid())
    }

    /// Freezes the server (`SIGSTOP`): connections stay open but nothing is
    /// answered until [`resume`](Self::resume).
    pub fn pause(&self) -> Result<()> {
        let local = self.local("pause")?;
        local.proc.pause(&self.what())
    }

    /// Lets a paused server run again (`SIGCONT`).
    pub fn resume(&self) -> Result<()> {
        let local = self.local("resume")?;
        local.proc.resume(&self.what())
    }

    /// Kills the server (`SIGKILL`) and reaps it; it stays down until
    /// [`restart`](Self::restart). Killing a killed server does nothing.
    pub fn kill(&mut self) -> Result<()> {
        self.local_mut("kill")?.proc.kill();
        Ok(())
    }

    /// Kills the server if it is running, then starts it again on the same
    /// port, with an empty data set, and waits until it answers `PING`.
    pub fn restart(&mut self) -> Result<()> {
        let port = self.port;
        let local = self.local_mut("restart")?;
        local.proc.kill();
        local.launch(port)
    }

    /// Runs `ACL SETUSER user rules...` as the default user (Redis 6+), for example
    /// `acl_setuser("locks", &["on", ">secret", "~fencelock:*", "-@all", "+evalsha"])`.
    /// Fails with [`Error::InvalidArgument`] carrying the server's own text (`-ERR ...`) if it
    /// refuses a rule, and with [`Error::Unsupported`] on an external server. Local
    /// servers only: an external one ([`is_external`](Self::is_external)) may need a password
    /// this crate does not know, and its users are not ours to change.
    pub fn acl_setuser(&self, user: &str, rules: &[&str]) -> Result<()> {
        self.local("ACL SETUSER")?;
        let mut args = vec!["ACL", "SETUSER", user];
        args.extend_from_slice(rules);
        let what = format!("ACL SETUSER {user} on {}", self.what());
        match command_reply(self.port, &args) {
            Ok(reply) if reply == "+OK" => Ok(()),
            Ok(reply) => Err(Error::InvalidArgument(format!(
                "{what}: the server answered {reply}"
            ))),
            Err(e) => Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!("{what}: {e}"),
            ))),
        }
    }

    /// The URL that logs in as `user` with `password`: `redis://user:password@127.0.0.1:PORT`
    /// (both percent-encoded where a URL needs it).
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "redis://{}:{}@127.0.0.1:{}",
            percent_encode(user),
            percent_encode(password),
            self.port
        )
    }

    fn what(&self) -> String {
        format!("redis-server on 127.0.0.1:{}", self.port)
    }

    fn local(&self, op: &str) -> Result<&Local> {
        self.local
            .as_ref()
            .ok_or_else(|| Error::Unsupported(format!("{op} on the Redis server at {}", self.url)))
    }

    fn local_mut(&mut self, op: &str) -> Result<&mut Local> {
        let url = &self.url;
        self.local
            .as_mut()
            .ok_or_else(|| Error::Unsupported(format!("{op} on the Redis server at {url}")))
    }
}

impl Local {
    /// Spawns the server on `port` and waits until it answers.
    fn launch(&mut self, port: u16) -> Result<()> {
        let what = format!("redis-server on 127.0.0.1:{port}");
        log_marker(&self.log, &format!("starting {what}"));
        let mut command = command(&self.binary, port, self.dir.path());
        command.args(&self.args);
        if let Some(clock) = &self.clock {
            clock.apply(&mut command)?;
        }
        self.proc = Proc::spawn(command, &self.log)?;
        wait_ready(&mut self.proc, &what, &self.log, || ping(port))
    }
}

fn command(binary: &Path, port: u16, dir: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--daemonize", "no"])
        .current_dir(dir);
    cmd
}

/// True if the server on `port` answers `PING` with `+PONG`.
pub(crate) fn ping(port: u16) -> bool {
    exchange(port, b"PING\r\n", 1).is_some_and(|reply| reply.starts_with(b"+PONG"))
}

/// True if the server on `port` answers `AUTH password` with `+OK` and then `PING` with
/// `+PONG`.
pub(crate) fn ping_as(port: u16, password: &str) -> bool {
    let request = format!(
        "*2\r\n$4\r\nAUTH\r\n${}\r\n{password}\r\n*1\r\n$4\r\nPING\r\n",
        password.len()
    );
    exchange(port, request.as_bytes(), 2).is_some_and(|reply| reply.starts_with(b"+OK\r\n+PONG"))
}

/// Sends `request` to the server on `port` and reads until `lines` lines came back, each
/// step within 500 ms; `None` if any fails.
fn exchange(port: u16, request: &[u8], lines: usize) -> Option<Vec<u8>> {
    let timeout = Duration::from_millis(500);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream.write_all(request).ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 64];
    while reply.iter().filter(|b| **b == b'\n').count() < lines {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
        }
    }
    Some(reply)
}

/// Sends one command (as a RESP array) to the server on `port` as the default user and returns
/// the first line of its answer without the line end: `+OK`, `-ERR ...`, `:1`, and so on.
fn command_reply(port: u16, args: &[&str]) -> std::io::Result<String> {
    let timeout = Duration::from_secs(10);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream.write_all(&request)?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut buf)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => reply.extend_from_slice(&buf[..n]),
        }
    }
    let line = reply.split(|b| *b == b'\r').next().unwrap_or_default();
    Ok(String::from_utf8_lossy(line).into_owned())
}

/// `text` with every byte outside `A-Z a-z 0-9 - . _ ~` percent-encoded, for a URL's user part.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
