//! The TLS servers answer over TLS with the test CA's certificates, and refuse what they should
//! (a missing client certificate where one is required), checked with each server's own
//! command-line client so these tests do not depend on the store crates.

use std::path::Path;
use std::process::Command;

use test_servers::{PostgresServer, ServerCert, TestCa, TlsEtcd, TlsRedis};

fn run(program: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(program)
        .args(args)
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success() && !text.contains("Error"), text)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn redis_ping(ca: &TestCa, port: u16, client_cert: bool) -> (bool, String) {
    let port = port.to_string();
    let mut args = vec!["-h", "127.0.0.1", "-p", &port, "--tls"];
    let ca_file = ca.ca_file();
    args.extend(["--cacert", path(&ca_file)]);
    let (crt, key) = (ca.client_cert(), ca.client_key());
    if client_cert {
        args.extend(["--cert", path(&crt), "--key", path(&key)]);
    }
    args.push("PING");
    run("redis-cli", &args)
}

#[test]
fn redis_answers_over_tls_and_demands_a_client_cert_when_told() {
    let ca = TestCa::generate().expect("test CA");
    let open = TlsRedis::start(&ca, ServerCert::Valid).expect("redis with TLS");
    let (ok, text) = redis_ping(&ca, open.tls_port(), false);
    assert!(ok && text.contains("PONG"), "{text}");

    let strict = TlsRedis::start(&ca, ServerCert::RequireClientCert).expect("redis with mTLS");
    let (ok, text) = redis_ping(&ca, strict.tls_port(), false);
    assert!(!ok, "no client cert, yet: {text}");
    let (ok, text) = redis_ping(&ca, strict.tls_port(), true);
    assert!(ok && text.contains("PONG"), "{text}");
}

#[test]
fn etcd_answers_over_tls_and_demands_a_client_cert_when_told() {
    let ca = TestCa::generate().expect("test CA");
    let ca_file = ca.ca_file();
    let (crt, key) = (ca.client_cert(), ca.client_key());
    for (cert, with_client_cert, expect_ok) in [
        (ServerCert::Valid, false, true),
        (ServerCert::RequireClientCert, false, false),
        (ServerCert::RequireClientCert, true, true),
    ] {
        let etcd = TlsEtcd::start(&ca, cert).expect("etcd with TLS");
        let endpoint = etcd.tls_url().replace("etcds://", "https://");
        let mut args = vec!["--endpoints", &endpoint, "--dial-timeout=3s"];
        let ca_arg = format!("--cacert={}", path(&ca_file));
        let cert_arg = format!("--cert={}", path(&crt));
        let key_arg = format!("--key={}", path(&key));
        args.push(&ca_arg);
        if with_client_cert {
            args.extend([cert_arg.as_str(), key_arg.as_str()]);
        }
        args.extend(["put", "k", "v"]);
        let (ok, text) = run("etcdctl", &args);
        assert_eq!(
            ok, expect_ok,
            "{cert:?}, client cert {with_client_cert}: {text}"
        );
    }
}

#[test]
fn postgres_answers_over_tls_and_demands_a_client_cert_when_told() {
    let ca = TestCa::generate().expect("test CA");
    let select = |server: &PostgresServer, client_cert: bool| {
        let mut conninfo = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full \
             sslrootcert={}",
            server.port(),
            path(&ca.ca_file())
        );
        if client_cert {
            conninfo.push_str(&format!(
                " sslcert={} sslkey={}",
                path(&ca.client_cert()),
                path(&ca.client_key())
            ));
        }
        run(
            "psql",
            &[
                &conninfo,
                "-Atc",
                "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
            ],
        )
    };
    let open = PostgresServer::start_tls(&ca, ServerCert::Valid).expect("postgres with TLS");
    let (ok, text) = select(&open, false);
    assert!(ok && text.trim() == "t", "{text}");
    drop(open);

    let strict =
        PostgresServer::start_tls(&ca, ServerCert::RequireClientCert).expect("postgres with mTLS");
    let (ok, text) = select(&strict, false);
    assert!(!ok, "no client cert, yet: {text}");
    let (ok, text) = select(&strict, true);
    assert!(ok && text.trim() == "t", "{text}");
}
