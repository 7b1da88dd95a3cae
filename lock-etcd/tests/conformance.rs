//! The whole conformance suite against a real single-member etcd started by test-servers.

mod common;

use std::sync::Arc;

use common::EtcdFactory;
use test_servers::shared;

conformance::conformance_tests!(async {
    Arc::new(EtcdFactory {
        url: shared::etcd().url(),
    })
});
