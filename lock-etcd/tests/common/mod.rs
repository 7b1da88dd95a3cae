//! Shared by the integration tests: store handles with a generous connect timeout, and the
//! conformance suite's factory over any etcd URL (one member or a cluster).
#![allow(dead_code)]

use std::sync::Arc;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::DynLockStore;
use fencelock_etcd::{EtcdConfig, EtcdStore};

/// A connected store handle; the generous connect timeout (other test processes may load this
/// machine) joins `url`'s query, if it has one, and `options` (`"&prefix=x"`) follow it.
pub(crate) async fn store(url: &str, options: &str) -> EtcdStore {
    let separator = if url.contains('?') { '&' } else { '?' };
    let config =
        EtcdConfig::from_url(&format!("{url}{separator}connect_timeout=30{options}")).unwrap();
    EtcdStore::connect(config).await.expect("connect")
}

/// The conformance suite's handles on the etcd at `url`.
pub(crate) struct EtcdFactory {
    pub url: String,
}

#[async_trait]
impl StoreFactory for EtcdFactory {
    async fn handle(&self) -> DynLockStore {
        Arc::new(store(&self.url, "").await)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let config = EtcdConfig::from_url(&format!(
            "etcd://127.0.0.1:{}?connect_timeout=1&command_timeout=1",
            test_servers::closed_ports(1)[0]
        ))
        .expect("config");
        Arc::new(EtcdStore::connect_lazy(config).await.expect("lazy connect"))
    }
}

/// A metric from the `/metrics` of the etcd member at `endpoint` (host:port, plain text):
/// `name` as etcd prints it, labels included (`grpc_server_started_total{grpc_method="Txn",…}`).
pub(crate) async fn metric(endpoint: &str, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(endpoint)
        .await
        .expect("connect to /metrics");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    socket
        .write_all(request.as_bytes())
        .await
        .expect("ask for /metrics");
    let mut body = String::new();
    socket
        .read_to_string(&mut body)
        .await
        .expect("read /metrics");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("etcd reports no {name}"))
}
