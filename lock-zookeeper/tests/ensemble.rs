//! The whole conformance suite against a real three-server ZooKeeper ensemble, test-servers'
//! shared one: every handle is given all three servers.

mod common;

use std::sync::Arc;

use common::ZookeeperFactory;
use test_servers::ZookeeperEnsemble;

fencelock_conformance::conformance_tests!(async {
    Arc::new(ZookeeperFactory {
        url: ZookeeperEnsemble::shared_ensemble().url(),
    })
});
