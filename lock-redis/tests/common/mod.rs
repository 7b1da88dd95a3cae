//! Shared by the integration tests: store handles with generous timeouts, a free port.
#![allow(dead_code)]

use lock_redis::{RedisConfig, RedisStore};

/// `url` with extra query options (`"prefix=x&command_timeout=1s"`) appended.
pub fn with_options(url: &str, options: &str) -> String {
    if options.is_empty() {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{options}")
}

/// A connected store handle. Generous timeouts: other test processes may load this machine.
pub async fn store(url: &str, options: &str) -> RedisStore {
    let url = with_options(&with_options(url, "connect_timeout=30s"), options);
    RedisStore::connect(RedisConfig::from_url(&url).expect("config"))
        .await
        .expect("connect")
}

/// A loopback port that was just free: nothing listens there.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A plain redis-crate connection, outside any store, for admin commands.
pub async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// Runs an admin command.
pub async fn admin_query<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &redis::Cmd,
) -> T {
    command.query_async(conn).await.expect("admin command")
}
