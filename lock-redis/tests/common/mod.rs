//! Shared by the integration tests: store handles with generous timeouts, admin connections.
#![allow(dead_code)]

use fencelock_redis::{RedisConfig, RedisStore};

/// `url` with extra query options (`"prefix=x&command_timeout=1s"`) appended.
pub(crate) fn with_options(url: &str, options: &str) -> String {
    if options.is_empty() {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{options}")
}

/// A connected store handle. Generous timeouts: other test processes may load this machine.
pub(crate) async fn store(url: &str, options: &str) -> RedisStore {
    let url = with_options(&with_options(url, "connect_timeout=30s"), options);
    RedisStore::connect(RedisConfig::from_url(&url).expect("config"))
        .await
        .expect("connect")
}

/// A plain redis-crate connection, outside any store, for admin commands.
pub(crate) async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// Runs an admin command.
pub(crate) async fn admin_query<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    command: &redis::Cmd,
) -> T {
    command.query_async(conn).await.expect("admin command")
}

/// Retries `attempt` while the store is unavailable (a failover in progress, the client finding
/// the new master), up to `times` times, 100 ms apart; any other answer is returned.
pub(crate) async fn retrying<T, F, Fut>(times: usize, mut attempt: F) -> fencelock_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = fencelock_core::Result<T>>,
{
    let mut left = times;
    loop {
        match attempt().await {
            Err(fencelock_core::Error::Unavailable { .. }) if left > 0 => {
                left -= 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            answer => return answer,
        }
    }
}
