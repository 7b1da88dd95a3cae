//! PostgreSQL (`initdb` + `postgres`) in a temporary directory.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{self, log_marker, log_tail, start_error, wait_ready, Proc, TempDir};
use crate::{Error, Result, ServerCert, TestCa};

const ENV_URL: &str = "LOCK_TEST_POSTGRES_URL";

/// Where Debian installs the server binaries: `/usr/lib/postgresql/<ver>/bin`.
const DEBIAN_PG_DIR: &str = "/usr/lib/postgresql";

/// How long a graceful stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A PostgreSQL server for tests: a fresh cluster (`initdb -A trust -U
/// postgres`) in a temporary directory, served on a free port of 127.0.0.1
/// with `fsync=on`, `synchronous_commit=on` and `max_connections=1000`; or
/// an external server named by `LOCK_TEST_POSTGRES_URL`.
///
/// PostgreSQL refuses to run as root: when the tests run as root, `initdb`,
/// `postgres` and `pg_ctl` run as the `postgres` system user, in a directory
/// under `/tmp` that it owns.
///
/// Dropping it shuts the server down (immediate mode, then `SIGKILL` if
/// needed) and removes the temporary directory.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    url: String,
    local: Option<Local>,
}

#[derive(Debug)]
struct Bins {
    postgres: PathBuf,
    initdb: PathBuf,
    pg_ctl: PathBuf,
    pg_isready: PathBuf,
}

#[derive(Debug)]
struct Local {
    // Stopped (see `Drop`) before `dir` is removed.
    proc: Proc,
    bins: Bins,
    /// `(uid, gid)` to run the server as, when we are root.
    user: Option<(u32, u32)>,
    data: PathBuf,
    sockets: PathBuf,
    log: PathBuf,
    /// Extra `name=value` settings, passed with `-c` at every launch.
    settings: Vec<String>,
    /// The wall clock a test steps while the server runs, if it was started with one.
    clock: Option<crate::ClockControl>,
    dir: TempDir,
}

impl PostgresServer {
    /// Creates a fresh cluster, starts the server and waits until
    /// `pg_isready` says it accepts connections (or returns a handle to
    /// `LOCK_TEST_POSTGRES_URL` if that is set).
    ///
    /// Fails with [`Error::MissingBinary`] if PostgreSQL is not installed
    /// (neither in `/usr/lib/postgresql/*/bin` nor on `PATH`).
    pub fn start() -> Result<Self> {
        if let Some(url) = crate::external_url(ENV_URL) {
            return Ok(PostgresServer {
                port: crate::url_port(&url, 5432),
                url,
                local: None,
            });
        }
        Self::start_local(None, &[], false)
    }

    /// Starts a local server whose wall clock (`now()`, `clock_timestamp()`) a test steps while
    /// it runs with [`clock`](Self::clock) (the clock shim, in the postmaster and every
    /// backend; timers such as `idle_session_timeout` run on the monotonic clock, left alone).
    /// Always local; kept across restarts.
    pub fn start_with_clock() -> Result<Self> {
        Self::start_local(None, &[], true)
    }

    /// The control of the server's wall clock, for a server from
    /// [`start_with_clock`](Self::start_with_clock).
    pub fn clock(&self) -> Option<&crate::ClockControl> {
        self.local.as_ref().and_then(|l| l.clock.as_ref())
    }

    /// Starts a local server (always local, whatever `LOCK_TEST_POSTGRES_URL` says) with extra
    /// settings, each passed as `-c name=value` after the defaults, so it wins over them, and
    /// passed again at every [`restart`](Self::restart). For crash tests that need the server
    /// to keep commits in memory, e.g. `[("wal_writer_delay", "10s")]`.
    ///
    /// Fails with [`Error::InvalidArgument`] for a name that is not `[a-z_]+` or a value with
    /// whitespace or `=`, and otherwise as [`start`](Self::start).
    pub fn start_with_settings(settings: &[(&str, &str)]) -> Result<Self> {
        for (name, value) in settings {
            let plain_name =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            let plain_value =
                !value.is_empty() && !value.contains(|c: char| c.is_whitespace() || c == '=');
            if !plain_name || !plain_value {
                return Err(Error::InvalidArgument(format!(
                    "a PostgreSQL setting must be [a-z_]+ = a value without spaces or '=', not {name:?} = {value:?}"
                )));
            }
        }
        let settings = settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>();
        Self::start_local(None, &settings, false)
    }

    /// Starts a local server with `ssl = on`, presenting `cert` from `ca`; always local. With
    /// [`ServerCert::RequireClientCert`] TCP clients must use TLS and present a certificate
    /// signed by `ca` (`hostssl … trust clientcert=verify-ca`); otherwise plain text is
    /// accepted too. The URL stays `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn start_tls(ca: &TestCa, cert: ServerCert) -> Result<Self> {
        Self::start_local(Some((ca, cert)), &[], false)
    }

    fn start_local(
        tls: Option<(&TestCa, ServerCert)>,
        settings: &[String],
        clock: bool,
    ) -> Result<Self> {
        let bins = find_bins()?;
        let user = if process::is_root() {
            Some(postgres_user().ok_or_else(|| {
                Error::Start {
                    server: "PostgreSQL".into(),
                    reason: "running as root, and there is no `postgres` user to run it as \
                         (the Debian package `postgresql` creates one)"
                        .into(),
                    log_tail: String::new(),
                }
            })?)
        } else {
            None
        };

        let mut port = process::free_ports(1)?[0];
        // The postgres user must be able to reach its directory.
        let base = user.map(|_| Path::new("/tmp"));
        let dir = TempDir::new("pg", port, base)?;
        let data = dir.path().join("data");
        let sockets = dir.path().join("sock");
        fs::create_dir(&sockets)?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&sockets, Some(uid), Some(gid))?;
        }
        let mut local = Local {
            proc: Proc::none(),
            log: dir.path().join("postgres.log"),
            bins,
            user,
            data,
            sockets,
            settings: settings.to_vec(),
            clock: clock.then(crate::ClockControl::new).transpose()?,
            dir,
        };
        local.initdb()?;
        if let Some((ca, cert)) = tls {
            local.enable_tls(ca, cert)?;
        }

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
        Ok(PostgresServer {
            port,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            local: Some(local),
        })
    }

    /// The URL to connect to: `postgres://postgres@127.0.0.1:PORT/postgres`
    /// (user `postgres`, no password: `trust` authentication), or the
    /// external URL.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// True if this handle points at a server given by
    /// `LOCK_TEST_POSTGRES_URL`.
    pub fn is_external(&self) -> bool {
        self.local.is_none()
    }

    /// The postmaster's process id, `None` if external or killed.
    pub fn pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(|l| l.proc.pid())
    }

    /// Freezes the server (`SIGSTOP` to the postmaster and all its backends).
    pub fn pause(&self) -> Result<()> {
        let local = self.local("pause")?;
        local.proc.pause(&self.what())
    }

    /// Lets a paused server run again (`SIGCONT`).
    pub fn resume(&self) -> Result<()> {
        let local = self.local("resume")?;
        local.proc.resume(&self.what())
    }

    /// Kills the postmaster and its backends (`SIGKILL`) and reaps it; the
    /// server stays down until [`restart`](Self::restart). Like a crash,
    /// except that it also frees the server's System V shared memory.
    pub fn kill(&mut self) -> Result<()> {
        let local = self.local_mut("kill")?;
        local.proc.kill();
        cleanup_shared_memory(&local.data);
        Ok(())
    }

    /// Shuts the server down cleanly if it is running (`pg_ctl stop -m
    /// fast`), then starts it again on the same port and data directory and
    /// waits until it accepts connections.
    pub fn restart(&mut self) -> Result<()> {
        let (port, what) = (self.port, self.what());
        let local = self.local_mut("restart")?;
        local.stop("fast", &what)?;
        local.launch(port)
    }

    /// Simulates a crash: `pg_ctl stop -m immediate` (no checkpoint, as if
    /// the machine lost power after the last fsync), then starts the server
    /// again on the same port and data directory; it runs crash recovery, so
    /// committed data survives. Waits until it accepts connections. If the
    /// server was killed, it is just started.
    pub fn crash_and_restart(&mut self) -> Result<()> {
        let (port, what) = (self.port, self.what());
        let local = self.local_mut("crash_and_restart")?;
        local.stop("immediate", &what)?;
        local.launch(port)
    }

    /// Makes a fresh database `name` and a login role `name` holding only what a least-privilege
    /// fencelock role holds, and returns the role's URL (`postgres://name@HOST:PORT/name`).
    ///
    /// Runs, as the server's superuser (with `psql`): `DROP DATABASE IF EXISTS name WITH
    /// (FORCE)`, `DROP ROLE IF EXISTS name` (so a rerun against an external server starts
    /// clean), `CREATE ROLE name LOGIN` (no `CREATEDB`, no `CREATEROLE`), `CREATE DATABASE
    /// name`, then in it:
    ///
    /// ```sql
    /// REVOKE ALL ON DATABASE name FROM PUBLIC;   -- no TEMPORARY, no CONNECT for others
    /// GRANT CONNECT ON DATABASE name TO name;
    /// REVOKE ALL ON SCHEMA public FROM PUBLIC;   -- no CREATE (PostgreSQL 15's default), no USAGE
    /// GRANT USAGE ON SCHEMA public TO name;
    /// ```
    ///
    /// and for each `(ddl, table, privileges)` of `tables`: `ddl` (the fence table's
    /// `CREATE TABLE`, run by the superuser, who owns the table), then `GRANT privileges ON
    /// table TO name`. A fresh database keeps the other tests on a shared server undisturbed.
    ///
    /// Fails with [`Error::InvalidArgument`] unless `name` is 1 to 40 of `[a-z0-9_]` starting
    /// with a letter, [`Error::MissingBinary`] without `psql` (package `postgresql-client`), and
    /// [`Error::Start`] with `psql`'s output if a statement fails.
    pub fn least_privilege_role(
        &self,
        name: &str,
        tables: &[(&str, &str, &str)],
    ) -> Result<String> {
        let plain = name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain {
            return Err(Error::InvalidArgument(format!(
                "a least-privilege role's name must be 1 to 40 of [a-z0-9_] starting with a letter, not {name:?}"
            )));
        }
        let psql = process::find_binary("psql", "postgresql-client")?;
        let what = format!("the least-privilege role {name} on {}", self.what());
        self.psql(
            &psql,
            "postgres",
            &format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE);\n\
                 DROP ROLE IF EXISTS \"{name}\";\n\
                 CREATE ROLE \"{name}\" LOGIN;\n\
                 CREATE DATABASE \"{name}\";\n"
            ),
            &what,
        )?;
        let mut setup = format!(
            "REVOKE ALL ON DATABASE \"{name}\" FROM PUBLIC;\n\
             GRANT CONNECT ON DATABASE \"{name}\" TO \"{name}\";\n\
             REVOKE ALL ON SCHEMA public FROM PUBLIC;\n\
             GRANT USAGE ON SCHEMA public TO \"{name}\";\n"
        );
        for (ddl, table, privileges) in tables {
            setup.push_str(&format!(
                "{};\nGRANT {privileges} ON {table} TO \"{name}\";\n",
                ddl.trim_end().trim_end_matches(';')
            ));
        }
        self.psql(&psql, name, &setup, &what)?;
        Ok(self.url_on(Some(name), name))
    }

    /// This server's URL with `user` (`None`: its own user and password) and `database` in
    /// place of its own; the query is kept.
    fn url_on(&self, user: Option<&str>, database: &str) -> String {
        let (scheme, rest) = self
            .url
            .split_once("://")
            .unwrap_or(("postgres", &self.url));
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (own_user, host_port) = match rest[..end].rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(userinfo), host_port),
            None => (None, &rest[..end]),
        };
        let query = rest[end..].find('?').map_or("", |i| &rest[end + i..]);
        let user = user.or(own_user).map_or(String::new(), |u| format!("{u}@"));
        format!("{scheme}://{user}{host_port}/{database}{query}")
    }

    /// Runs `sql` (statements one by one, stopping at the first error) with `psql` as this
    /// server's own user on `database`.
    fn psql(&self, psql: &Path, database: &str, sql: &str, what: &str) -> Result<()> {
        let admin = self.url_on(None, database);
        let mut child = Command::new(psql)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", "-d"])
            .arg(&admin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(sql.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Start {
            server: what.to_string(),
            reason: format!("psql failed ({}) running:\n{sql}", out.status),
            log_tail: String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned(),
        })
    }

    fn what(&self) -> String {
        format!("postgres on 127.0.0.1:{}", self.port)
    }

    fn local(&self, op: &str) -> Result<&Local> {
        self.local.as_ref().ok_or_else(|| {
            Error::Unsupported(format!("{op} on the PostgreSQL server at {}", self.url))
        })
    }

    fn local_mut(&mut self, op: &str) -> Result<&mut Local> {
        let url = &self.url;
        self.local
            .as_mut()
            .ok_or_else(|| Error::Unsupported(format!("{op} on the PostgreSQL server at {url}")))
    }
}

impl Local {
    /// A command for one of the server programs, run as the postgres user
    /// when we are root.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        // The postgres user may not be able to enter our working directory.
        cmd.current_dir(self.dir.path()).env("LC_ALL", "C");
        cmd
    }

    fn initdb(&self) -> Result<()> {
        let mut cmd = self.command(&self.bins.initdb);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .arg("--no-locale");
        let log = self.dir.path().join("initdb.log");
        process::run_logged(cmd, &log).map_err(|reason| start_error("initdb", reason, &log))
    }

    /// Copies the certificates into the data directory (the server reads them as its own
    /// user and refuses a key others can read) and turns `ssl` on in `postgresql.conf`.
    fn enable_tls(&self, ca: &TestCa, cert: ServerCert) -> Result<()> {
        let (crt, key) = cert.files(ca);
        for (from, name, mode) in [
            (crt, "server.crt", 0o644),
            (key, "server.key", 0o600),
            (ca.ca_file(), "root.crt", 0o644),
        ] {
            let to = self.data.join(name);
            fs::copy(from, &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
            }
        }
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))?;
        writeln!(
            conf,
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'"
        )?;
        if cert.requires_client_cert() {
            fs::write(
                self.data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n",
            )?;
        }
        Ok(())
    }

    /// Starts the postmaster on `port` and waits until it accepts connections.
    fn launch(&mut self, port: u16) -> Result<()> {
        let what = format!("postgres on 127.0.0.1:{port}");
        log_marker(&self.log, &format!("starting {what}"));
        let mut cmd = self.command(&self.bins.postgres);
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd)?;
        }
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-p")
            .arg(port.to_string())
            .arg("-k")
            .arg(&self.sockets)
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", "max_connections=1000", "-c", "shared_buffers=64MB"])
            // Dynamic shared memory in files under the data directory, so a
            // killed server leaves nothing behind in /dev/shm.
            .args(["-c", "dynamic_shared_memory_type=mmap"]);
        for setting in &self.settings {
            cmd.arg("-c").arg(setting);
        }
        self.proc = Proc::spawn(cmd, &self.log)?;
        let pg_isready = self.bins.pg_isready.clone();
        wait_ready(&mut self.proc, &what, &self.log, || {
            is_ready(&pg_isready, port)
        })
    }

    /// `pg_ctl stop -m <mode>` if the server is running; always leaves it
    /// stopped and reaped.
    fn stop(&mut self, mode: &str, what: &str) -> Result<()> {
        if !self.proc.is_running() {
            return Ok(());
        }
        self.proc.unpause();
        let mut cmd = self.command(&self.bins.pg_ctl);
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "-t", "30"]);
        let result = process::run_logged(cmd, &self.log);
        if !self.proc.wait_timeout(STOP_TIMEOUT) {
            self.proc.kill();
        }
        cleanup_shared_memory(&self.data);
        result.map_err(|reason| Error::Stop {
            server: what.to_string(),
            reason: format!("{reason}; last lines of its log:\n{}", log_tail(&self.log)),
        })
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if self.proc.is_running() {
            // Immediate shutdown: quick, and it frees all shared memory.
            self.proc.unpause();
            self.proc.signal_leader(libc::SIGQUIT);
            if !self.proc.wait_timeout(Duration::from_secs(5)) {
                self.proc.kill();
            }
        }
        cleanup_shared_memory(&self.data);
    }
}

/// True if `pg_isready` says the server on `port` accepts connections.
fn is_ready(pg_isready: &Path, port: u16) -> bool {
    Command::new(pg_isready)
        .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", "1", "-U", "postgres", "-d", "postgres"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The server binaries: the highest version in `/usr/lib/postgresql/*/bin`,
/// else `PATH`.
fn find_bins() -> Result<Bins> {
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for entry in fs::read_dir(DEBIAN_PG_DIR).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(version) = name
            .split('.')
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
        else {
            continue;
        };
        let bin = entry.path().join("bin");
        let complete = ["postgres", "initdb", "pg_ctl"]
            .iter()
            .all(|b| process::is_executable(&bin.join(b)));
        if complete && !matches!(&best, Some((v, _)) if *v >= version) {
            best = Some((version, bin));
        }
    }
    let pg_isready = |bin: Option<&Path>| {
        bin.map(|b| b.join("pg_isready"))
            .filter(|p| process::is_executable(p))
            .map_or_else(
                || process::find_binary("pg_isready", "postgresql-client"),
                Ok,
            )
    };
    if let Some((_, bin)) = best {
        return Ok(Bins {
            postgres: bin.join("postgres"),
            initdb: bin.join("initdb"),
            pg_ctl: bin.join("pg_ctl"),
            pg_isready: pg_isready(Some(&bin))?,
        });
    }
    Ok(Bins {
        postgres: process::find_binary("postgres", "postgresql")?,
        initdb: process::find_binary("initdb", "postgresql")?,
        pg_ctl: process::find_binary("pg_ctl", "postgresql")?,
        pg_isready: pg_isready(None)?,
    })
}

/// `(uid, gid)` of the `postgres` user, from `/etc/passwd`.
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        match fields.as_slice() {
            ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    })
}

/// Removes the System V shared memory segment that a killed postmaster
/// leaves behind (PostgreSQL keeps a small one as an interlock), once no
/// process is attached any more. Does nothing if `postmaster.pid` is gone
/// (clean shutdown) or names a segment that no longer exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn cleanup_shared_memory(data: &Path) {
    let Ok(pid_file) = fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    // Line 7: "<shmem key> <shmem id>".
    let Some(line) = pid_file.lines().nth(6) else {
        return;
    };
    let mut fields = line.split_whitespace();
    let (Some(Ok(key)), Some(Ok(id))) = (
        fields.next().map(str::parse::<libc::key_t>),
        fields.next().map(str::parse::<libc::c_int>),
    ) else {
        return;
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: shmid_ds is plain data; IPC_STAT fills it in.
        let mut info: libc::shmid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable shmid_ds.
        if unsafe { libc::shmctl(id, libc::IPC_STAT, &mut info) } != 0 || info.shm_perm.__key != key
        {
            return; // gone, or the id now belongs to someone else
        }
        if info.shm_nattch == 0 || std::time::Instant::now() > deadline {
            // SAFETY: IPC_RMID takes no buffer. With processes still attached
            // the segment is destroyed when the last one detaches.
            unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn cleanup_shared_memory(_data: &Path) {}
