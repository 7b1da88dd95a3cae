//! `closed_ports`: distinct loopback ports that refuse connections while the test runs.

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};

use test_servers::closed_ports;

#[test]
fn closed_ports_are_distinct_and_refuse_connections() {
    let ports = closed_ports(16);
    assert_eq!(ports.len(), 16);
    let distinct: HashSet<_> = ports.iter().collect();
    assert_eq!(distinct.len(), ports.len(), "repeated ports: {ports:?}");
    for port in ports {
        let error = TcpStream::connect(("127.0.0.1", port))
            .map(drop)
            .expect_err("a closed port accepted a connection");
        assert_eq!(
            error.kind(),
            ErrorKind::ConnectionRefused,
            "port {port}: {error}"
        );
    }
}

/// A port that was only free a moment ago could be taken by a server another test starts; a
/// closed port stays reserved, so nothing can listen there later in the process.
#[test]
fn nothing_can_listen_on_a_closed_port_later() {
    let ports = closed_ports(4);
    for port in ports.iter().copied() {
        let taken = TcpListener::bind(("127.0.0.1", port));
        assert!(taken.is_err(), "a listener could bind closed port {port}");
    }
    assert!(
        closed_ports(4).iter().all(|port| !ports.contains(port)),
        "a closed port was handed out twice"
    );
}
