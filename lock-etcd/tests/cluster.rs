//! The whole conformance suite against a real three-member etcd cluster, test-servers' shared
//! one: every handle is given all three endpoints.

mod common;

use std::sync::Arc;

use common::EtcdFactory;
use test_servers::shared;

fencelock_conformance::conformance_tests!(async {
    Arc::new(EtcdFactory {
        url: shared::etcd_cluster().url(),
    })
});
