//! A throwaway certificate authority for TLS tests, made with the `openssl` command (Debian
//! package `openssl`).
//!
//! [`TestCa::generate`] writes, into its own temporary directory:
//! - `ca.crt`: the test CA (EC P-256, valid two days);
//! - `server.crt`/`server.key`: signed by it, SAN `IP:127.0.0.1` and `DNS:localhost`;
//! - `elsewhere.crt`/`elsewhere.key`: signed by it, SAN `DNS:elsewhere.invalid` only, for
//!   host name mismatch tests;
//! - `client.crt`/`client.key`: signed by it, for client-certificate authentication (CN
//!   `fencelock-client`);
//! - `other-ca.crt`: an unrelated CA that signed none of them, for wrong-CA tests.
//!
//! Keys are unencrypted PKCS#8 PEM files with mode 0600.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::process::{self, log_marker, wait_ready, Proc, TempDir};
use crate::{Error, MariadbServer, PostgresServer, RedisServer, Result};

/// The common name of the client certificate (PostgreSQL's `cert` authentication maps it to
/// the database user of the same name).
pub const CLIENT_CN: &str = "fencelock-client";

/// A test CA and the certificates it signed; dropping it removes the files.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Generates a fresh CA, server, mismatched-server and client certificates, and an
    /// unrelated CA. Fails with [`Error::MissingBinary`] if `openssl` is not installed.
    pub fn generate() -> Result<Self> {
        let openssl = process::find_binary("openssl", "openssl")?;
        let dir = TempDir::new("tls", 0, None)?;
        let ca = TestCa { dir };
        let run = |args: &[&str]| -> Result<()> {
            let output = Command::new(&openssl)
                .args(args)
                .current_dir(ca.dir.path())
                .output()?;
            if output.status.success() {
                Ok(())
            } else {
                Err(Error::Start {
                    server: "the test CA (openssl)".into(),
                    reason: format!("openssl {} failed", args.join(" ")),
                    log_tail: String::from_utf8_lossy(&output.stderr).into_owned(),
                })
            }
        };
        let new_key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for (name, cn) in [
            ("ca", "fencelock test CA"),
            ("other-ca", "unrelated test CA"),
        ] {
            let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
            let subject = format!("/CN={cn}");
            let mut args = vec!["req", "-x509"];
            args.extend(new_key);
            args.extend([
                "-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subject,
            ]);
            args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
            args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
            run(&args)?;
        }
        for (name, cn, extensions) in [
            (
                "server",
                "127.0.0.1",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            (
                "elsewhere",
                "elsewhere.invalid",
                "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n",
            ),
            ("client", CLIENT_CN, "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            fs::write(ca.dir.path().join(&ext), extensions)?;
            let subject = format!("/CN={cn}");
            let mut args = vec!["req"];
            args.extend(new_key);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            run(&args)?;
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ])?;
        }
        for entry in fs::read_dir(ca.dir.path())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "key") {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
            }
        }
        Ok(ca)
    }

    /// One CA per test process, generated on first use and shared by every test in it (never
    /// dropped, like the servers of [`crate::shared`]).
    ///
    /// # Panics
    ///
    /// If the CA cannot be generated (the error names a missing `openssl`).
    pub fn shared() -> &'static TestCa {
        static CA: OnceLock<std::result::Result<TestCa, String>> = OnceLock::new();
        match CA.get_or_init(|| TestCa::generate().map_err(|e| e.to_string())) {
            Ok(ca) => ca,
            Err(error) => panic!("test CA: {error}"),
        }
    }

    /// The URL option `tls_ca=PATH` trusting [`ca_file`](Self::ca_file), as every fencelock
    /// store reads it.
    pub fn ca_option(&self) -> String {
        option("tls_ca", &self.ca_file())
    }

    /// `url` with [`ca_option`](Self::ca_option) added to its query (after `?`, or after `&`
    /// where it has a query already): the URL trusting this CA.
    pub fn with_ca_option(&self, url: &str) -> String {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}{}", self.ca_option())
    }

    /// `tls_ca=PATH` trusting [`other_ca_file`](Self::other_ca_file), a CA that signed none of
    /// the certificates.
    pub fn other_ca_option(&self) -> String {
        option("tls_ca", &self.other_ca_file())
    }

    /// The URL options `tls_cert=PATH&tls_key=PATH` of the client certificate and its key.
    pub fn client_cert_options(&self) -> String {
        format!(
            "{}&{}",
            option("tls_cert", &self.client_cert()),
            option("tls_key", &self.client_key())
        )
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate that signed the server and client certificates.
    pub fn ca_file(&self) -> PathBuf {
        self.file("ca.crt")
    }

    /// A CA certificate that signed none of them.
    pub fn other_ca_file(&self) -> PathBuf {
        self.file("other-ca.crt")
    }

    /// The server certificate (SAN `127.0.0.1`, `localhost`).
    pub fn server_cert(&self) -> PathBuf {
        self.file("server.crt")
    }

    /// The server certificate's key.
    pub fn server_key(&self) -> PathBuf {
        self.file("server.key")
    }

    /// A server certificate for `elsewhere.invalid` only: a client connecting to 127.0.0.1
    /// must refuse it.
    pub fn elsewhere_cert(&self) -> PathBuf {
        self.file("elsewhere.crt")
    }

    /// The key of [`elsewhere_cert`](Self::elsewhere_cert).
    pub fn elsewhere_key(&self) -> PathBuf {
        self.file("elsewhere.key")
    }

    /// The client certificate (CN [`CLIENT_CN`]).
    pub fn client_cert(&self) -> PathBuf {
        self.file("client.crt")
    }

    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.file("client.key")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// `name=PATH`; the paths are under the temporary directory, plain UTF-8 without `&` or `#`.
fn option(name: &str, path: &Path) -> String {
    let path = path.to_str().expect("the test CA's paths are UTF-8");
    format!("{name}={path}")
}

/// One TLS server per [`ServerCert`], started with [`TestCa::shared`] on first use and shared by
/// every test of the process; the first start's error otherwise.
pub(crate) struct PerCert<T> {
    valid: OnceLock<std::result::Result<T, String>>,
    strict: OnceLock<std::result::Result<T, String>>,
    elsewhere: OnceLock<std::result::Result<T, String>>,
}

impl<T> PerCert<T> {
    pub(crate) const fn new() -> Self {
        PerCert {
            valid: OnceLock::new(),
            strict: OnceLock::new(),
            elsewhere: OnceLock::new(),
        }
    }

    pub(crate) fn get(
        &'static self,
        cert: ServerCert,
        what: &str,
        start: impl FnOnce(&TestCa, ServerCert) -> Result<T>,
    ) -> &'static T {
        let cell = match cert {
            ServerCert::Valid => &self.valid,
            ServerCert::RequireClientCert => &self.strict,
            ServerCert::Elsewhere => &self.elsewhere,
        };
        match cell.get_or_init(|| start(TestCa::shared(), cert).map_err(|e| e.to_string())) {
            Ok(server) => server,
            Err(error) => panic!("{what} with TLS: {error}"),
        }
    }
}

impl PostgresServer {
    /// The process's shared TLS server presenting `cert` from [`TestCa::shared`]
    /// ([`PostgresServer::start_tls`]), started on first use; for tests that only lock and
    /// unlock, each on its own keys.
    ///
    /// # Panics
    ///
    /// If the server cannot be started.
    pub fn shared_tls(cert: ServerCert) -> &'static PostgresServer {
        static SERVERS: PerCert<PostgresServer> = PerCert::new();
        SERVERS.get(cert, "postgres", PostgresServer::start_tls)
    }
}

impl MariadbServer {
    /// The process's shared TLS server presenting `cert` from [`TestCa::shared`]
    /// ([`MariadbServer::start_tls`]), started on first use; for tests that only lock and
    /// unlock, each on its own keys.
    ///
    /// # Panics
    ///
    /// If the server cannot be started.
    pub fn shared_tls(cert: ServerCert) -> &'static MariadbServer {
        static SERVERS: PerCert<MariadbServer> = PerCert::new();
        SERVERS.get(cert, "mariadb", MariadbServer::start_tls)
    }
}

/// Which certificate a TLS server presents and whether it demands one from clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerCert {
    /// [`TestCa::server_cert`]: valid for 127.0.0.1; client certificates optional.
    Valid,
    /// [`TestCa::server_cert`], and a client certificate signed by the CA is required.
    RequireClientCert,
    /// [`TestCa::elsewhere_cert`]: a host name mismatch for a client of 127.0.0.1.
    Elsewhere,
}

impl ServerCert {
    /// The certificate and key files this choice presents.
    pub(crate) fn files(self, ca: &TestCa) -> (PathBuf, PathBuf) {
        match self {
            ServerCert::Valid | ServerCert::RequireClientCert => {
                (ca.server_cert(), ca.server_key())
            }
            ServerCert::Elsewhere => (ca.elsewhere_cert(), ca.elsewhere_key()),
        }
    }

    /// Whether clients must present a certificate.
    pub(crate) fn requires_client_cert(self) -> bool {
        self == ServerCert::RequireClientCert
    }
}

/// `redis-server` speaking TLS on one port and plain text on another (the plain port serves
/// the readiness check and the tests of a TLS client against a plain-text server).
#[derive(Debug)]
pub struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
}

impl TlsRedis {
    /// Starts a local server presenting `cert` from `ca` on its TLS port; always local.
    pub fn start(ca: &TestCa, cert: ServerCert) -> Result<Self> {
        Self::start_with_args(ca, cert, &[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (an ACL user, …).
    pub fn start_with_args(ca: &TestCa, cert: ServerCert, extra: &[&str]) -> Result<Self> {
        let (crt, key) = cert.files(ca);
        let mut last_error = None;
        for _ in 0..process::START_ATTEMPTS {
            let tls_port = process::free_ports(1)?[0].to_string();
            let mut args: Vec<String> = vec!["--tls-port".into(), tls_port.clone()];
            for (flag, path) in [
                ("--tls-cert-file", &crt),
                ("--tls-key-file", &key),
                ("--tls-ca-cert-file", &ca.ca_file()),
            ] {
                args.push(flag.into());
                args.push(path.display().to_string());
            }
            args.push("--tls-auth-clients".into());
            args.push(
                if cert.requires_client_cert() {
                    "yes"
                } else {
                    "optional"
                }
                .into(),
            );
            args.extend(extra.iter().map(|a| a.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match RedisServer::start_with_args(&args) {
                Ok(server) => {
                    return Ok(TlsRedis {
                        server,
                        tls_port: tls_port.parse().expect("a port number"),
                    })
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// The process's shared server presenting `cert` from [`TestCa::shared`], started on
    /// first use; for tests that only lock and unlock, each on its own keys.
    ///
    /// # Panics
    ///
    /// If the server cannot be started.
    pub fn shared(cert: ServerCert) -> &'static TlsRedis {
        static SERVERS: PerCert<TlsRedis> = PerCert::new();
        SERVERS.get(cert, "redis", TlsRedis::start)
    }

    /// `rediss://127.0.0.1:TLS_PORT` (no options).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// The same server's plain-text URL, `redis://127.0.0.1:PORT`.
    pub fn plain_url(&self) -> String {
        self.server.url()
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The plain-text server handle (fault injection, pid).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }
}

/// A single-member etcd whose client port speaks only TLS, with or without client-certificate
/// authentication; `/health` is served in plain text on a separate metrics port.
#[derive(Debug)]
pub struct TlsEtcd {
    proc: Proc,
    client_port: u16,
    // Dropped after `proc` (fields drop in order).
    _dir: TempDir,
}

impl TlsEtcd {
    /// Starts a local member presenting `cert` from `ca`; always local.
    pub fn start(ca: &TestCa, cert: ServerCert) -> Result<Self> {
        let binary = process::find_binary("etcd", "etcd-server")?;
        let (crt, key) = cert.files(ca);
        let mut last_error = None;
        for _ in 0..process::START_ATTEMPTS {
            let ports = process::free_ports(3)?;
            let (client, peer, metrics) = (ports[0], ports[1], ports[2]);
            let dir = TempDir::new("etcd-tls", client, None)?;
            let log = dir.path().join("etcd.log");
            let what = format!("etcd (TLS) on 127.0.0.1:{client}");
            log_marker(&log, &format!("starting {what}"));
            let mut cmd = Command::new(&binary);
            cmd.arg("--name=m0")
                .arg(format!("--data-dir={}", dir.path().join("data").display()))
                .arg(format!("--listen-client-urls=https://127.0.0.1:{client}"))
                .arg(format!(
                    "--advertise-client-urls=https://127.0.0.1:{client}"
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=m0=http://127.0.0.1:{peer}"))
                .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"))
                .arg(format!("--cert-file={}", crt.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg("--heartbeat-interval=10")
                .arg("--election-timeout=100")
                .arg("--logger=zap")
                .arg("--log-outputs=stderr")
                .current_dir(dir.path());
            if cert.requires_client_cert() {
                cmd.arg("--client-cert-auth")
                    .arg(format!("--trusted-ca-file={}", ca.ca_file().display()));
            }
            if std::env::var_os("ETCD_UNSUPPORTED_ARCH").is_none() {
                if let Some(goarch) = crate::etcd::unsupported_goarch() {
                    cmd.env("ETCD_UNSUPPORTED_ARCH", goarch);
                }
            }
            let mut proc = Proc::spawn(cmd, &log)?;
            match wait_ready(&mut proc, &what, &log, || crate::etcd::healthy(metrics)) {
                Ok(()) => {
                    return Ok(TlsEtcd {
                        proc,
                        client_port: client,
                        _dir: dir,
                    })
                }
                // Exited early: most likely a port was taken meanwhile.
                Err(error) if !proc.is_running() => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    /// The process's shared member presenting `cert` from [`TestCa::shared`], started on
    /// first use; for tests that only lock and unlock, each on its own keys.
    ///
    /// # Panics
    ///
    /// If the member cannot be started.
    pub fn shared(cert: ServerCert) -> &'static TlsEtcd {
        static SERVERS: PerCert<TlsEtcd> = PerCert::new();
        SERVERS.get(cert, "etcd", TlsEtcd::start)
    }

    /// `etcds://127.0.0.1:PORT` (no options).
    pub fn tls_url(&self) -> String {
        format!("etcds://127.0.0.1:{}", self.client_port)
    }

    /// The same port as `etcd://…`: a plain-text client against a TLS server.
    pub fn plain_url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }

    /// The member's process id.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}
