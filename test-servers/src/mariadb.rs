//! MariaDB (`mariadb-install-db` + `mariadbd`) in a temporary directory, in plain text or
//! with TLS.

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{self, log_marker, start_error, wait_ready, Proc, TempDir};
use crate::{Error, Result, ServerCert, TestCa};

const ENV_URL: &str = "LOCK_TEST_MYSQL_URL";

/// The Debian package that provides both binaries.
const PACKAGE: &str = "mariadb-server";

/// Where Debian puts the server binary (not on a normal user's `PATH`).
const DEBIAN_SERVER: &str = "/usr/sbin/mariadbd";

/// How long a graceful stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The user and database the tests connect with; created by the init file at every start
/// (idempotent), since a fresh data directory has only `root@localhost`, which a TCP client
/// on 127.0.0.1 does not match under `skip-name-resolve`.
const USER: &str = "fencelock";
const DATABASE: &str = "fencelock";
const INIT_SQL: &str = "CREATE USER IF NOT EXISTS 'fencelock'@'%';
GRANT ALL PRIVILEGES ON *.* TO 'fencelock'@'%';
CREATE DATABASE IF NOT EXISTS fencelock;
";

/// The password of the users of a TLS server (see [`MariadbServer::start_tls`]). Not a
/// secret: it is in the URLs so that a refusal in a TLS test cannot come from a wrong
/// password, and so that those tests can check that it never shows in an error.
const TLS_PASSWORD: &str = "fencelock-tls-pw";

/// The user of a TLS server that needs a client certificate whatever the server's
/// [`ServerCert`].
const X509_USER: &str = "fencelock_x509";

/// Settings of a test server: small InnoDB files so a data directory is made in under a
/// second, durable commits (the default, stated here because the fence counters rely on it),
/// and room for the connections the tests hold (one per held lease; the default is 151).
const SERVER_ARGS: &[&str] = &[
    "--skip-name-resolve",
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=32M",
    "--innodb-flush-log-at-trx-commit=1",
    "--max-connections=1000",
    "--thread-cache-size=64",
    "--performance-schema=OFF",
];

/// A MariaDB server for tests: a fresh data directory (`mariadb-install-db`) in a temporary
/// directory, served on a free port of 127.0.0.1 with durable commits
/// (`innodb_flush_log_at_trx_commit=1`) and `max_connections=1000`, with a user `fencelock`
/// (no password, all privileges) and a database `fencelock`; or an external server named by
/// `LOCK_TEST_MYSQL_URL`.
///
/// When the tests run as root, `mariadb-install-db` and `mariadbd` run as the `mysql` system
/// user (which the Debian package creates), in a directory under `/tmp` that it owns.
///
/// [`start_tls`](Self::start_tls) starts one that speaks TLS and lets its users in only over
/// TLS (`REQUIRE SSL`) or only with a client certificate (`REQUIRE X509`).
///
/// Dropping it kills the server (`SIGKILL`; InnoDB would recover) and removes the temporary
/// directory.
#[derive(Debug)]
pub struct MariadbServer {
    port: u16,
    url: String,
    local: Option<Local>,
}

#[derive(Debug)]
struct Local {
    // Killed (see `Drop` of `Proc`) before `dir` is removed.
    proc: Proc,
    server: PathBuf,
    /// `(uid, gid)` to run the server as, when we are root.
    user: Option<(u32, u32)>,
    data: PathBuf,
    log: PathBuf,
    /// `--ssl-*` arguments of a TLS server, empty for plain text.
    tls_args: Vec<String>,
    /// The wall clock a test steps while the server runs, if it was started with one.
    clock: Option<crate::ClockControl>,
    dir: TempDir,
}

impl MariadbServer {
    /// Creates a fresh data directory, starts the server and waits until it greets a TCP
    /// client (or returns a handle to `LOCK_TEST_MYSQL_URL` if that is set).
    ///
    /// Fails with [`Error::MissingBinary`] naming the Debian package `mariadb-server` if
    /// `mariadbd` or `mariadb-install-db` is not installed.
    pub fn start() -> Result<Self> {
        if let Some(url) = crate::external_url(ENV_URL) {
            return Ok(MariadbServer {
                port: crate::url_port(&url, 3306),
                url,
                local: None,
            });
        }
        Self::start_local(None, false)
    }

    /// Starts a local server whose wall clock (`NOW(6)`, `UNIX_TIMESTAMP()`) a test steps while
    /// it runs with [`clock`](Self::clock) (the clock shim; monotonic timers are left alone).
    /// Always local; kept across restarts.
    pub fn start_with_clock() -> Result<Self> {
        Self::start_local(None, true)
    }

    /// The control of the server's wall clock, for a server from
    /// [`start_with_clock`](Self::start_with_clock).
    pub fn clock(&self) -> Option<&crate::ClockControl> {
        self.local.as_ref().and_then(|l| l.clock.as_ref())
    }

    /// Starts a local server with TLS (`ssl_ca`, `ssl_cert`, `ssl_key`), presenting `cert` from
    /// `ca`; always local. A plain-text client still gets a greeting, but neither of its two
    /// users logs in without TLS. Both have the password that is in their URLs, and all privileges:
    /// - `fencelock` ([`url`](Self::url):
    ///   `mysql://fencelock:fencelock-tls-pw@127.0.0.1:PORT/fencelock`) must use TLS
    ///   (`REQUIRE SSL`), or, with [`ServerCert::RequireClientCert`], also present a client
    ///   certificate signed by `ca` (`REQUIRE X509`);
    /// - `fencelock_x509` ([`client_cert_url`](Self::client_cert_url)) must present a client
    ///   certificate signed by `ca` (`REQUIRE X509`) whatever `cert` is.
    ///
    /// MariaDB asks every TLS client for a certificate and checks the requirement at login; a
    /// login refused for it is `Access denied` (error 1045), the same as for a wrong password.
    ///
    /// The performance schema is on, so `performance_schema.status_by_thread` shows each
    /// connection's `Ssl_cipher` (empty for plain text).
    pub fn start_tls(ca: &TestCa, cert: ServerCert) -> Result<Self> {
        Self::start_local(Some((ca, cert)), false)
    }

    fn start_local(tls: Option<(&TestCa, ServerCert)>, clock: bool) -> Result<Self> {
        let server = find_server()?;
        let install_db = process::find_binary("mariadb-install-db", PACKAGE)?;
        let user = if process::is_root() {
            Some(mysql_user().ok_or_else(|| {
                Error::Start {
                    server: "MariaDB".into(),
                    reason: "running as root, and there is no `mysql` user to run it as \
                         (the Debian package `mariadb-server` creates one)"
                        .into(),
                    log_tail: String::new(),
                }
            })?)
        } else {
            None
        };

        let mut port = process::free_ports(1)?[0];
        // The mysql user must be able to reach its directory.
        let base = user.map(|_| Path::new("/tmp"));
        let dir = TempDir::new("mariadb", port, base)?;
        let data = dir.path().join("data");
        fs::create_dir(&data)?;
        let tmp = dir.path().join("tmp");
        fs::create_dir(&tmp)?;
        let init_sql = match tls {
            None => INIT_SQL.to_owned(),
            Some((_, cert)) => tls_init_sql(cert),
        };
        fs::write(dir.path().join("init.sql"), init_sql)?;
        if let Some((uid, gid)) = user {
            for path in [dir.path(), &data, &tmp, &dir.path().join("init.sql")] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
        }
        let mut local = Local {
            proc: Proc::none(),
            log: dir.path().join("mariadb.log"),
            server,
            user,
            data,
            tls_args: Vec::new(),
            clock: clock.then(crate::ClockControl::new).transpose()?,
            dir,
        };
        if let Some((ca, cert)) = tls {
            local.enable_tls(ca, cert)?;
        }
        local.install(&install_db)?;

        let mut attempt = 1;
        loop {
            match local.launch(port) {
                Ok(()) => break,
                // Exited early: most likely the port was taken meanwhile.
                Err(_) if !local.proc.is_running() && attempt < process::START_ATTEMPTS => {
                    attempt += 1;
                    port = process::free_ports(1)?[0];
                }
                Err(e) => return Err(e),
            }
        }
        let password = if tls.is_some() {
            format!(":{TLS_PASSWORD}")
        } else {
            String::new()
        };
        Ok(MariadbServer {
            port,
            url: format!("mysql://{USER}{password}@127.0.0.1:{port}/{DATABASE}"),
            local: Some(local),
        })
    }

    /// The URL to connect to: `mysql://fencelock@127.0.0.1:PORT/fencelock` (no password), or
    /// the external URL; for a TLS server `mysql://fencelock:fencelock-tls-pw@…` (see
    /// [`start_tls`](Self::start_tls)).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// On a server of [`start_tls`](Self::start_tls), the URL of the user that must present a
    /// client certificate: `mysql://fencelock_x509:fencelock-tls-pw@127.0.0.1:PORT/fencelock`.
    /// `None` on a plain-text or external server.
    pub fn client_cert_url(&self) -> Option<String> {
        let local = self.local.as_ref()?;
        (!local.tls_args.is_empty()).then(|| {
            format!(
                "mysql://{X509_USER}:{TLS_PASSWORD}@127.0.0.1:{}/{DATABASE}",
                self.port
            )
        })
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True if this handle points at a server given by `LOCK_TEST_MYSQL_URL`.
    pub fn is_external(&self) -> bool {
        self.local.is_none()
    }

    /// The server's process id, `None` if external or killed.
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.proc.pid())
    }

    /// Freezes the server (`SIGSTOP`): connections stay open, nothing is answered.
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
    /// [`restart`](Self::restart).
    pub fn kill(&mut self) -> Result<()> {
        self.local_mut("kill")?.proc.kill();
        Ok(())
    }

    /// Shuts the server down cleanly if it is running (`SIGTERM`, waiting for it to exit),
    /// then starts it again on the same port and data directory and waits until it greets a
    /// client.
    pub fn restart(&mut self) -> Result<()> {
        let (port, what) = (self.port, self.what());
        let local = self.local_mut("restart")?;
        local.stop(&what)?;
        local.launch(port)
    }

    /// Simulates a crash: `SIGKILL` (no shutdown, as if the machine lost power after the
    /// last durable commit), then starts the server again on the same port and data
    /// directory; InnoDB recovers every committed transaction. Waits until it greets a client.
    pub fn crash_and_restart(&mut self) -> Result<()> {
        let port = self.port;
        let local = self.local_mut("crash_and_restart")?;
        local.proc.kill();
        local.launch(port)
    }

    fn what(&self) -> String {
        format!("mariadbd on 127.0.0.1:{}", self.port)
    }

    fn local(&self, op: &str) -> Result<&Local> {
        self.local.as_ref().ok_or_else(|| {
            Error::Unsupported(format!("{op} on the MariaDB server at {}", self.url))
        })
    }

    fn local_mut(&mut self, op: &str) -> Result<&mut Local> {
        let url = &self.url;
        self.local
            .as_mut()
            .ok_or_else(|| Error::Unsupported(format!("{op} on the MariaDB server at {url}")))
    }
}

impl Local {
    /// A command for one of the server programs, run as the mysql user when we are root.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        // The mysql user may not be able to enter our working directory.
        cmd.current_dir(self.dir.path()).env("LC_ALL", "C");
        cmd
    }

    /// Copies the certificates into the server's directory (it reads them as its own user) and
    /// keeps the `--ssl-*` arguments for every launch.
    fn enable_tls(&mut self, ca: &TestCa, cert: ServerCert) -> Result<()> {
        let (crt, key) = cert.files(ca);
        let mut args = Vec::new();
        for (from, name, mode, flag) in [
            (ca.ca_file(), "ca.crt", 0o644, "--ssl-ca"),
            (crt, "server.crt", 0o644, "--ssl-cert"),
            (key, "server.key", 0o600, "--ssl-key"),
        ] {
            let to = self.dir.path().join(name);
            fs::copy(from, &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
            }
            args.push(format!("{flag}={}", to.display()));
        }
        // Per-connection Ssl_cipher in performance_schema.status_by_thread.
        args.push("--performance-schema=ON".into());
        self.tls_args = args;
        Ok(())
    }

    /// A temporary directory of this server's own: at every start MariaDB deletes every `#sql*`
    /// file in its tmpdir, which with the default `/tmp` are also the internal temporary tables
    /// of every other server running (seen as `Error on delete of '/tmp/#sql-temptable-….MAI'`
    /// in a statement of a server beside which another one started).
    fn tmpdir_arg(&self) -> String {
        format!("--tmpdir={}", self.dir.path().join("tmp").display())
    }

    /// Makes the system tables in the data directory.
    fn install(&self, install_db: &Path) -> Result<()> {
        let mut cmd = self.command(install_db);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data.display()))
            .arg(self.tmpdir_arg())
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(SERVER_ARGS);
        let log = self.dir.path().join("install.log");
        process::run_logged(cmd, &log)
            .map_err(|reason| start_error("mariadb-install-db", reason, &log))
    }

    /// Starts the server on `port` and waits until it greets a client.
    fn launch(&mut self, port: u16) -> Result<()> {
        let what = format!("mariadbd on 127.0.0.1:{port}");
        log_marker(&self.log, &format!("starting {what}"));
        let dir = self.dir.path();
        let mut cmd = self.command(&self.server);
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd)?;
        }
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.data.display()))
            .arg(self.tmpdir_arg())
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
            .arg(format!("--init-file={}", dir.join("init.sql").display()))
            .args(SERVER_ARGS)
            // After SERVER_ARGS: the last --performance-schema wins.
            .args(&self.tls_args);
        self.proc = Proc::spawn(cmd, &self.log)?;
        wait_ready(&mut self.proc, &what, &self.log, || greets(port))
    }

    /// `SIGTERM` (a clean shutdown) if the server is running; always leaves it stopped and
    /// reaped.
    fn stop(&mut self, what: &str) -> Result<()> {
        if !self.proc.is_running() {
            return Ok(());
        }
        self.proc.unpause();
        self.proc.signal_leader(libc::SIGTERM);
        if self.proc.wait_timeout(STOP_TIMEOUT) {
            return Ok(());
        }
        self.proc.kill();
        Err(Error::Stop {
            server: what.to_string(),
            reason: format!("it did not exit within {STOP_TIMEOUT:?} of SIGTERM and was killed"),
        })
    }
}

/// The init file of a TLS server: the users `fencelock` (let in only over TLS, or only with a
/// client certificate for [`ServerCert::RequireClientCert`]) and [`X509_USER`] (only with a
/// client certificate), both with [`TLS_PASSWORD`]. `CREATE OR REPLACE` so that a restart
/// finds them as they are made here.
fn tls_init_sql(cert: ServerCert) -> String {
    let require = if cert.requires_client_cert() {
        "X509"
    } else {
        "SSL"
    };
    let mut sql = String::new();
    for (user, require) in [(USER, require), (X509_USER, "X509")] {
        sql.push_str(&format!(
            "CREATE OR REPLACE USER '{user}'@'%' IDENTIFIED BY '{TLS_PASSWORD}' REQUIRE {require};
GRANT ALL PRIVILEGES ON *.* TO '{user}'@'%';
"
        ));
    }
    sql.push_str(&format!(
        "CREATE DATABASE IF NOT EXISTS {DATABASE};
"
    ));
    sql
}

/// True if the server on `port` sends a protocol-10 handshake to a new TCP client (and not
/// an error packet): the server is past recovery and the init file, and accepts logins.
fn greets(port: u16) -> bool {
    let timeout = Duration::from_millis(500);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    // A packet: 3 bytes length, 1 byte sequence, then the payload, whose first byte is the
    // protocol version (10) in a handshake, or 0xff in an error packet.
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).is_ok() && head[4] == 10
}

/// `mariadbd`: Debian's `/usr/sbin`, else `PATH`.
fn find_server() -> Result<PathBuf> {
    let debian = PathBuf::from(DEBIAN_SERVER);
    if process::is_executable(&debian) {
        return Ok(debian);
    }
    process::find_binary("mariadbd", PACKAGE)
}

/// `(uid, gid)` of the `mysql` user, from `/etc/passwd`.
fn mysql_user() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            ["mysql", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    })
}
