//! The built `lockctl` against every real store compiled in, each started by the test support.

mod support;

/// The CLI cases for one store: `$url` gives the store's URL, `$unreachable` a URL of the
/// same kind pointing at a closed port.
macro_rules! store_cases {
    ($url:expr, $unreachable:expr) => {
        #[test]
        fn ten_concurrent_runs_never_overlap() {
            crate::support::ten_concurrent_runs_never_overlap(&$url);
        }

        #[test]
        fn busy_key_exits_75() {
            crate::support::busy_key_exits_75(&$url);
        }

        #[test]
        fn ls_lists_the_held_keys_under_a_prefix() {
            crate::support::ls_lists_the_held_keys_under_a_prefix(&$url);
        }

        #[test]
        fn several_keys_run_together_or_not_at_all() {
            crate::support::several_keys_run_together_or_not_at_all(&$url);
        }

        #[test]
        fn killed_holder_is_free_within_its_ttl() {
            crate::support::killed_holder_is_free_within_its_ttl(&$url);
        }

        #[test]
        fn stopped_holder_is_superseded_and_exits_70() {
            crate::support::stopped_holder_is_superseded_and_exits_70(&$url);
        }

        #[test]
        fn conformance_command_passes() {
            crate::support::conformance_command_passes(&$url);
        }

        #[test]
        fn elect_leads_one_at_a_time_and_leader_shows_it() {
            crate::support::elect_leads_one_at_a_time_and_leader_shows_it(&$url);
        }

        #[test]
        fn unreachable_store_exits_69() {
            crate::support::unreachable_store_exits_69(&$unreachable);
        }
    };
}

/// The process-tree cases for one store; each takes a few seconds of TTL and grace, so they
/// run on Redis and PostgreSQL only (the tree handling does not depend on the store).
macro_rules! tree_cases {
    ($url:expr) => {
        #[test]
        fn lost_lease_ends_the_whole_process_tree() {
            crate::support::lost_lease_ends_the_whole_process_tree(&$url);
        }

        #[test]
        fn killed_lockctl_ends_the_whole_process_tree() {
            crate::support::killed_lockctl_ends_the_whole_process_tree(&$url);
        }

        #[test]
        fn leftover_processes_end_before_the_release() {
            crate::support::leftover_processes_end_before_the_release(&$url);
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        shared::postgres().url()
    }

    store_cases!(
        url(),
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            closed_ports(1)[0]
        )
    );
    tree_cases!(url());
}

#[cfg(feature = "redis")]
mod redis {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        shared::redis().url()
    }

    store_cases!(url(), format!("redis://127.0.0.1:{}", closed_ports(1)[0]));
    tree_cases!(url());
}

#[cfg(feature = "etcd")]
mod etcd {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        shared::etcd().url()
    }

    store_cases!(url(), format!("etcd://127.0.0.1:{}", closed_ports(1)[0]));
}

#[cfg(feature = "redis")]
mod redlock {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        let hosts: Vec<String> = shared::redis_masters(5)
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    // Three distinct closed ports: a node listed twice is refused as bad input.
    store_cases!(url(), {
        let hosts: Vec<String> = closed_ports(3)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redlock://{}", hosts.join(","))
    });
}

#[cfg(feature = "redis")]
mod sentinel {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        shared::redis_sentinel().url()
    }

    store_cases!(url(), {
        let hosts: Vec<String> = closed_ports(3)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/fencelock", hosts.join(","))
    });
}

#[cfg(feature = "mysql")]
mod mysql {
    use test_servers::{closed_ports, shared};

    fn url() -> String {
        shared::mariadb().url()
    }

    store_cases!(
        url(),
        format!(
            "mysql://fencelock@127.0.0.1:{}/fencelock",
            closed_ports(1)[0]
        )
    );
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use test_servers::{closed_ports, ZookeeperEnsemble};

    fn url() -> String {
        ZookeeperEnsemble::shared_standalone().url()
    }

    store_cases!(
        url(),
        format!("zookeeper://127.0.0.1:{}", closed_ports(1)[0])
    );

    /// ZooKeeper's own bad input: an option it does not read, and a TTL shorter than the
    /// server's sessions allow (twice its minSessionTimeout of 200 ms on test-servers' server,
    /// which only the live server tells): exit 64, one line naming the rule.
    #[test]
    fn bad_input_exits_64() {
        let cases = [
            (
                format!("{}?prefx=/x", url()),
                "--ttl",
                "5s",
                "unknown option \"prefx\"",
            ),
            (url(), "--ttl", "300ms", "minimum of 400ms"),
        ];
        for (url, flag, ttl, needle) in cases {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
                .env("LOCK_URL", &url)
                .stdin(std::process::Stdio::null())
                .args(["run", "k", flag, ttl, "--", "true"])
                .output()
                .expect("runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(64), "{url} {ttl}: {stderr}");
            assert!(stderr.contains(needle), "{url} {ttl}: {stderr}");
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::OnceLock;

    use fencelock_sqlite::Lockout;

    /// A directory of this test process's own for its database files, under cargo's scratch
    /// directory for tests (target/tmp), so a run leaves nothing in the system's /tmp.
    fn dir() -> &'static PathBuf {
        static DIR: OnceLock<PathBuf> = OnceLock::new();
        DIR.get_or_init(|| {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("lockctl-sqlite-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a directory for the SQLite tests");
            dir
        })
    }

    /// One database file shared by every lockctl process of the cases, as on a real host.
    fn url() -> String {
        format!("sqlite://{}", dir().join("locks.db").display())
    }

    /// The unreachable store of SQLite: a database that another holder (this test process,
    /// through SQLite's own lock bytes) keeps locked for longer than lockctl's timeouts, so its
    /// connect fails with a retryable error: exit 69.
    fn locked_url() -> String {
        static LOCKED: OnceLock<(Lockout, String)> = OnceLock::new();
        LOCKED
            .get_or_init(|| {
                let path = dir().join("locked-out.db");
                let lockout = Lockout::hold(&path).expect("lock the database file");
                let url = format!(
                    "sqlite://{}?command_timeout=1s&connect_timeout=1s",
                    path.display()
                );
                (lockout, url)
            })
            .1
            .clone()
    }

    store_cases!(url(), locked_url());

    fn lockctl(url: &str) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockctl"));
        command.env("LOCK_URL", url);
        command
    }

    /// A path whose directory cannot be created (nobody, root included, creates files in
    /// /proc) is bad input: exit 64, one line naming the path.
    #[test]
    fn unwritable_path_exits_64() {
        let output = lockctl("sqlite:///proc/lockctl-test/locks.db")
            .args(["run", "k", "--", "true"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{stderr}");
        assert!(stderr.contains("/proc/lockctl-test"), "{stderr}");
    }

    /// A file that is not a SQLite database is the store answering with an error: exit 76,
    /// and the file is left as it was.
    #[test]
    fn not_a_database_exits_76() {
        let path = dir().join("not-a-database.db");
        let text = "not a database\n".repeat(300);
        std::fs::write(&path, &text).expect("write the file");
        let output = lockctl(&format!("sqlite://{}", path.display()))
            .args(["run", "k", "--", "true"])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(76), "{stderr}");
        assert!(stderr.contains("not a SQLite database"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
    }
}
