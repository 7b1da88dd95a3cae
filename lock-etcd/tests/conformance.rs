//! The whole conformance suite against a real single-member etcd started by test-servers.

mod common;

use std::sync::{Arc, OnceLock};

use common::EtcdFactory;
use test_servers::EtcdServer;

/// One server for every test of this file. test-servers kills it when the test process exits
/// (parent-death signal), although a static is never dropped.
static SERVER: OnceLock<EtcdServer> = OnceLock::new();

fn server_url() -> String {
    SERVER
        .get_or_init(|| EtcdServer::start().unwrap_or_else(|e| panic!("{e}")))
        .url()
}

conformance::conformance_tests!(async { Arc::new(EtcdFactory { url: server_url() }) });
