//! Starts, stops and injects faults into each real server.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use test_servers::{EtcdCluster, EtcdServer, PostgresServer, RedisServer};

/// Sends one RESP command and reads one reply (simple, error, integer or bulk).
fn redis(port: u16, args: &[&str], timeout: Duration) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply).into_owned();
        if let Some((first, rest)) = text.split_once("\r\n") {
            match first.strip_prefix('$').map(str::parse::<i64>) {
                Some(Ok(len)) if len >= 0 && rest.len() < len as usize + 2 => continue,
                _ => return Ok(text),
            }
        }
    }
}

fn ping(port: u16) -> bool {
    redis(port, &["PING"], Duration::from_millis(300)).is_ok_and(|r| r == "+PONG\r\n")
}

/// A plain HTTP/1.0 request to an etcd member; returns the body.
fn http(endpoint: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(endpoint).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {endpoint}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// True once no process with this pid exists (zombies included).
fn gone(pid: u32) -> bool {
    !PathBuf::from(format!("/proc/{pid}")).exists()
}

/// Direct children of `parent` (a postmaster's backends), from /proc.
fn children(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after_comm.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == parent {
            pids.push(pid);
        }
    }
    pids
}

/// Process state letter (R, S, T = stopped, Z = zombie), if it exists.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn redis_start_and_drop() {
    let server = RedisServer::start().unwrap();
    assert!(!server.is_external());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert!(ping(server.port()));
    let pid = server.pid().unwrap();
    drop(server);
    assert!(gone(pid), "redis-server {pid} survived the drop");
}

#[test]
fn redis_pause_and_resume() {
    let server = RedisServer::start().unwrap();
    server.pause().unwrap();
    assert!(!ping(server.port()), "a paused server answered");
    server.resume().unwrap();
    assert!(ping(server.port()));
    // A paused server is killed properly on drop, too.
    server.pause().unwrap();
    let pid = server.pid().unwrap();
    drop(server);
    assert!(gone(pid), "paused redis-server {pid} survived the drop");
}

#[test]
fn redis_restart_loses_data_and_keeps_port() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    let t = Duration::from_secs(2);
    assert_eq!(redis(port, &["SET", "k", "v"], t).unwrap(), "+OK\r\n");
    assert_eq!(redis(port, &["GET", "k"], t).unwrap(), "$1\r\nv\r\n");

    server.kill().unwrap();
    assert!(server.pid().is_none());
    assert!(!ping(port), "a killed server answered");
    server.kill().unwrap(); // idempotent

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_eq!(redis(port, &["GET", "k"], t).unwrap(), "$-1\r\n");

    // Restart of a running server.
    redis(port, &["SET", "k", "v"], t).unwrap();
    server.restart().unwrap();
    assert_eq!(redis(port, &["GET", "k"], t).unwrap(), "$-1\r\n");
}

#[test]
fn redis_start_many_gives_independent_servers() {
    let servers = RedisServer::start_many(3).unwrap();
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    let t = Duration::from_secs(2);
    redis(ports[0], &["SET", "only-here", "1"], t).unwrap();
    assert_eq!(
        redis(ports[1], &["GET", "only-here"], t).unwrap(),
        "$-1\r\n"
    );
    assert!(servers.iter().all(|s| ping(s.port())));
}

#[test]
fn etcd_single_member_restart_keeps_data() {
    let mut server = EtcdServer::start().unwrap();
    assert!(!server.is_external());
    let endpoint = server.endpoint();
    assert_eq!(server.url(), format!("etcd://{endpoint}"));
    assert!(http(&endpoint, "GET", "/health", "").contains(r#""health":"true""#));

    // key "foo", value "bar", base64 as the JSON gateway wants.
    http(
        &endpoint,
        "POST",
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmFy"}"#,
    );
    server.kill().unwrap();
    assert!(TcpStream::connect(&endpoint).is_err());
    server.restart().unwrap();
    assert_eq!(server.endpoint(), endpoint);
    let range = http(&endpoint, "POST", "/v3/kv/range", r#"{"key":"Zm9v"}"#);
    assert!(range.contains("YmFy"), "data lost over restart: {range}");

    let pid = server.pid().unwrap();
    drop(server);
    assert!(gone(pid), "etcd {pid} survived the drop");
}

#[test]
fn etcd_cluster_leader_follows_faults() {
    let mut cluster = EtcdCluster::start(3).unwrap();
    assert_eq!(cluster.member_count(), 3);
    let endpoints = cluster.endpoints();
    assert_eq!(cluster.url(), format!("etcd://{}", endpoints.join(",")));

    let leader = cluster.leader().unwrap();
    assert!(leader < 3);

    // Pausing the leader makes the others elect a new one.
    cluster.pause(leader).unwrap();
    let new_leader = cluster.leader().unwrap();
    assert_ne!(new_leader, leader);
    cluster.resume(leader).unwrap();

    // A killed follower comes back healthy with its data.
    let follower = (0..3).find(|&i| i != new_leader).unwrap();
    cluster.kill(follower).unwrap();
    assert!(cluster.pid(follower).is_none());
    cluster.restart(follower).unwrap();
    assert!(http(&endpoints[follower], "GET", "/health", "").contains(r#""health":"true""#));
    assert!(cluster.leader().unwrap() < 3);
    assert!(cluster.pause(3).is_err());

    let pids: Vec<u32> = (0..3).map(|i| cluster.pid(i).unwrap()).collect();
    drop(cluster);
    for pid in pids {
        assert!(gone(pid), "etcd member {pid} survived the drop");
    }
}

/// psql from the same installation the crate uses.
fn psql(url: &str, sql: &str) -> String {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    dirs.sort();
    let psql = dirs
        .iter()
        .rev()
        .map(|d| d.join("psql"))
        .find(|p| p.exists())
        .unwrap_or_else(|| "psql".into());
    let out = Command::new(psql)
        .args([
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .output()
        .expect("psql (Debian package postgresql-client)");
    assert!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn postgres_crash_and_restart_keeps_committed_data() {
    let mut server = PostgresServer::start().unwrap();
    assert!(!server.is_external());
    let url = server.url();
    assert_eq!(
        url,
        format!("postgres://postgres@127.0.0.1:{}/postgres", server.port())
    );
    psql(&url, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)");

    server.crash_and_restart().unwrap();
    assert_eq!(server.url(), url);
    assert_eq!(psql(&url, "SELECT x FROM t"), "42");

    // kill() takes the backends down too, not only the postmaster.
    let backends = children(server.pid().unwrap());
    assert!(backends.len() > 1, "postmaster has no children?");
    server.kill().unwrap();
    assert!(server.pid().is_none());
    eventually("killed backends gone", || {
        backends
            .iter()
            .all(|&p| matches!(state(p), None | Some('Z')))
    });
    server.restart().unwrap();
    assert_eq!(psql(&url, "SELECT x FROM t"), "42");

    // pause() freezes the backends too (they run in sessions of their own).
    let pid = server.pid().unwrap();
    let backends = children(pid);
    server.pause().unwrap();
    assert_eq!(state(pid), Some('T'));
    let states: Vec<_> = backends.iter().map(|&p| (p, state(p))).collect();
    assert!(
        states
            .iter()
            .all(|(_, s)| matches!(s, None | Some('T' | 'Z'))),
        "not all backends stopped: {states:?}"
    );
    server.resume().unwrap();
    assert_eq!(psql(&url, "SELECT count(*) FROM t"), "1");

    drop(server);
    eventually("postgres processes gone", || {
        gone(pid) && backends.iter().all(|&p| gone(p))
    });
}

/// Servers die with the test process even when no `Drop` runs (the test
/// process is killed): the parent-death signal takes them down.
#[test]
fn servers_die_with_a_killed_test_process() {
    if std::env::var_os("TEST_SERVERS_CHILD").is_some() {
        let server = RedisServer::start_many(1).unwrap();
        println!("REDIS_PID={}", server[0].pid().unwrap());
        thread::sleep(Duration::from_secs(60));
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "servers_die_with_a_killed_test_process",
            "--nocapture",
        ])
        .env("TEST_SERVERS_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let pid: u32 = loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(n > 0, "child test printed no pid");
        if let Some(pid) = line.trim().strip_prefix("REDIS_PID=") {
            break pid.parse().unwrap();
        }
    };
    assert_eq!(state(pid).map(|s| s != 'Z'), Some(true));
    child.kill().unwrap();
    child.wait().unwrap();
    // The killed process could not remove its temporary directory.
    let prefix = format!("fencelock-redis-{}-", child.id());
    for entry in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
    eventually("redis-server of a killed test process gone", || {
        matches!(state(pid), None | Some('Z'))
    });
}
