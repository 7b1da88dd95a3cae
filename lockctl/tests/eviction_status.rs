//! `lockctl` against Redis servers that may evict a held lock: refused with the setting named,
//! and a status that says when the eviction settings could not be read.

use std::process::{Command, Output};

use test_servers::RedisServer;

const EVICTING: &[&str] = &["--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru"];
/// A user that may run everything but `CONFIG` and `INFO`, as on some managed services.
const USER_WITHOUT_CONFIG_AND_INFO: &[&str] = &[
    "--user", "locker", "on", ">pw", "~*", "&*", "+@all", "-config", "-info",
];

fn server(args: &[&str]) -> RedisServer {
    RedisServer::start_with_args(args).unwrap_or_else(|e| panic!("{e}"))
}

fn status(url: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCK_URL", url)
        .args(["--connect-timeout", "30s", "status", "eviction-key"])
        .args(extra)
        .output()
        .expect("run lockctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn status_on_an_evicting_server_is_refused_naming_the_setting() {
    let server = server(EVICTING);
    let out = status(&server.url(), &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("maxmemory-policy volatile-lru"), "{stderr}");
    assert!(stderr.contains("allow_eviction=true"), "{stderr}");

    let out = status(&format!("{}?allow_eviction=true", server.url()), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "eviction-key: free");
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn status_says_when_the_eviction_settings_could_not_be_read() {
    let unreadable = server(&[EVICTING, USER_WITHOUT_CONFIG_AND_INFO].concat());
    let url = format!("redis://locker:pw@127.0.0.1:{}", unreadable.port());
    for json in [false, true] {
        let out = status(&url, if json { &["--json"] } else { &[] });
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        if json {
            assert_eq!(stdout.trim(), r#"{"key":"eviction-key","held":false}"#);
        } else {
            assert_eq!(stdout.trim(), "eviction-key: free");
        }
        assert!(stderr.contains("lockctl: warning:"), "{stderr}");
        assert!(stderr.contains("eviction settings unknown"), "{stderr}");
        assert!(!stderr.contains("pw@"), "the password printed: {stderr}");
    }

    // A user allowed CONFIG GET gets no warning.
    let plain = server(&[]);
    let out = status(&plain.url(), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
}
