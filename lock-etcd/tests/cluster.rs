//! The whole conformance suite against a real three-member etcd cluster started by
//! test-servers: every handle is given all three endpoints.

mod common;

use std::sync::{Arc, OnceLock};

use common::EtcdFactory;
use test_servers::EtcdCluster;

/// One cluster for every test of this file. test-servers kills it when the test process exits
/// (parent-death signal), although a static is never dropped.
static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();

fn cluster_url() -> String {
    CLUSTER
        .get_or_init(|| EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}")))
        .url()
}

conformance::conformance_tests!(async { Arc::new(EtcdFactory { url: cluster_url() }) });
