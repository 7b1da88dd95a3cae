//! The whole conformance suite against a real standalone ZooKeeper started by test-servers
//! (`tickTime` 100 ms, sessions of 200 ms to 10 s, so TTLs from 400 ms to 10 s by 100 ms).

mod common;

use std::sync::Arc;

use common::ZookeeperFactory;
use test_servers::ZookeeperEnsemble;

fencelock_conformance::conformance_tests!(async {
    Arc::new(ZookeeperFactory {
        url: ZookeeperEnsemble::shared_standalone().url(),
    })
});
