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

/// A loopback port nothing listens on.
#[allow(dead_code)]
fn closed_port() -> u16 {
    closed_ports(1)[0]
}

/// `count` distinct loopback ports nothing listens on (bound together, so they differ).
fn closed_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::OnceLock;

    use test_servers::PostgresServer;

    static SERVER: OnceLock<PostgresServer> = OnceLock::new();

    fn url() -> String {
        SERVER
            .get_or_init(|| PostgresServer::start().expect("PostgreSQL for the lockctl tests"))
            .url()
    }

    store_cases!(
        url(),
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            super::closed_port()
        )
    );
    tree_cases!(url());
}

#[cfg(feature = "redis")]
mod redis {
    use std::sync::OnceLock;

    use test_servers::RedisServer;

    static SERVER: OnceLock<RedisServer> = OnceLock::new();

    fn url() -> String {
        SERVER
            .get_or_init(|| RedisServer::start().expect("Redis for the lockctl tests"))
            .url()
    }

    store_cases!(url(), format!("redis://127.0.0.1:{}", super::closed_port()));
    tree_cases!(url());
}

#[cfg(feature = "etcd")]
mod etcd {
    use std::sync::OnceLock;

    use test_servers::EtcdServer;

    static SERVER: OnceLock<EtcdServer> = OnceLock::new();

    fn url() -> String {
        SERVER
            .get_or_init(|| EtcdServer::start().expect("etcd for the lockctl tests"))
            .url()
    }

    store_cases!(url(), format!("etcd://127.0.0.1:{}", super::closed_port()));
}

#[cfg(feature = "redis")]
mod redlock {
    use std::sync::OnceLock;

    use test_servers::RedisServer;

    static SERVERS: OnceLock<Vec<RedisServer>> = OnceLock::new();

    fn url() -> String {
        let servers = SERVERS.get_or_init(|| {
            RedisServer::start_many(5).expect("five Redis masters for the lockctl tests")
        });
        let hosts: Vec<String> = servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    }

    // Three distinct closed ports: a node listed twice is refused as bad input.
    store_cases!(url(), {
        let hosts: Vec<String> = super::closed_ports(3)
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        format!("redlock://{}", hosts.join(","))
    });
}
