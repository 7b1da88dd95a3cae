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

/// A loopback port nothing listens on.
#[allow(dead_code)]
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("local addr").port()
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

    store_cases!(url(), {
        // Three distinct closed ports: a node listed twice is refused as bad input.
        let listeners: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
            .collect();
        let hosts: Vec<String> = listeners
            .iter()
            .map(|l| format!("127.0.0.1:{}", l.local_addr().expect("local addr").port()))
            .collect();
        format!("redlock://{}", hosts.join(","))
    });
}
