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
