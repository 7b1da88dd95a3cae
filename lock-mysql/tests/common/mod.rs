//! What the MySQL test files share: the shared MariaDB server's configs and the clock the
//! server reads.

#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use fencelock_mysql::MysqlConfig;
use test_servers::shared;

/// A config on the shared server with `options` (a query string, `table=…` among them: each test
/// works on a fence table of its own), and a connect timeout that a loaded machine meets.
pub(crate) fn config(options: &str) -> MysqlConfig {
    let url = shared::mariadb().url();
    MysqlConfig::from_url(&format!("{url}?connect_timeout=30&{options}")).expect("config")
}

/// This host's clock in µs, which the test server (on this host) reads too.
pub(crate) fn unix_micros() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    u64::try_from(since.as_micros()).expect("micros fit")
}
