//! `test_servers::shared`: one server of each kind per test process, whoever asks first.

use std::collections::HashSet;
use std::net::TcpStream;
use std::thread;

use test_servers::shared;

fn answers(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[test]
fn threads_asking_at_once_share_one_redis() {
    let ports: HashSet<u16> = (0..4)
        .map(|_| thread::spawn(|| shared::redis().port()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().expect("no panic"))
        .collect();
    assert_eq!(ports.len(), 1, "several servers started: {ports:?}");
    assert!(std::ptr::eq(shared::redis(), shared::redis()));
    assert!(answers(shared::redis().port()));
}

#[test]
fn redis_masters_are_independent_and_shared_per_count() {
    let masters = shared::redis_masters(3);
    assert_eq!(masters.len(), 3);
    let ports: HashSet<u16> = masters.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 3, "masters share a server: {ports:?}");
    assert!(
        !ports.contains(&shared::redis().port()),
        "a master is the shared redis"
    );
    assert!(std::ptr::eq(masters, shared::redis_masters(3)));
    assert!(masters.iter().all(|s| answers(s.port())));
}

#[test]
fn etcd_and_its_cluster_are_shared() {
    let etcd = shared::etcd();
    assert!(std::ptr::eq(etcd, shared::etcd()));
    assert!(answers(etcd.port()));
    let cluster = shared::etcd_cluster();
    assert!(std::ptr::eq(cluster, shared::etcd_cluster()));
    assert_eq!(cluster.member_count(), shared::ETCD_CLUSTER_MEMBERS);
}

#[test]
fn postgres_is_shared() {
    let postgres = shared::postgres();
    assert!(std::ptr::eq(postgres, shared::postgres()));
    assert!(answers(postgres.port()));
}
