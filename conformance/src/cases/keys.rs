//! Keys are data: independent, hostile, similar, long and over-long keys.

use std::time::Duration;

use fencelock_core::limits::MAX_KEY_LEN;

use super::support::{expect_busy, expect_invalid, released};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

pub(super) async fn independent_keys_do_not_contend(ctx: Ctx) -> CaseResult {
    let a = ctx
        .store
        .try_acquire(&ctx.key("a"), ctx.timing.long_ttl)
        .await?;
    let b = ctx
        .handle()
        .await
        .try_acquire(&ctx.key("b"), ctx.timing.long_ttl)
        .await
        .map_err(|e| Failure(format!("a lease on one key blocked another key: {e}")))?;
    released(&ctx.store, &a, "a").await?;
    released(&ctx.store, &b, "b").await
}

/// Keys full of characters that mean something to Lua, SQL, shells, globs and hash tags.
fn hostile_keys() -> Vec<String> {
    [
        "ключ 🔒 鍵",
        "with spaces and\ttabs\nand newlines",
        "quotes ' \" `",
        "'; DROP TABLE locks; --",
        "redis.call('FLUSHALL')",
        "]] .. os.exit() .. [[",
        "{hash}{tags}",
        "*?[a-z]\\",
        "%_$1:/\\",
        "nul\u{0}inside",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub(super) async fn keys_are_data_not_code(ctx: Ctx) -> CaseResult {
    let other = ctx.handle().await;
    let mut leases = Vec::new();
    for suffix in hostile_keys() {
        let key = ctx.key(&suffix);
        let lease = ctx
            .store
            .try_acquire(&key, ctx.timing.long_ttl)
            .await
            .map_err(|e| Failure(format!("key {key:?} was not acquired: {e}")))?;
        ensure!(
            lease.key() == key,
            "the lease renamed {key:?} to {:?}",
            lease.key()
        );
        expect_busy(
            other.try_acquire(&key, ctx.timing.long_ttl).await,
            &format!("key {key:?}"),
        )?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, lease.key()).await?;
    }
    Ok(())
}

pub(super) async fn similar_keys_are_distinct(ctx: Ctx) -> CaseResult {
    let mut leases = Vec::new();
    for suffix in ["k", "k ", "K", "k\u{0}", "{k}", "k*", "k?", "k:", "k\\"] {
        let key = ctx.key(suffix);
        let lease = ctx
            .store
            .try_acquire(&key, ctx.timing.long_ttl)
            .await
            .map_err(|e| Failure(format!("key {key:?} collided with a similar key: {e}")))?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, lease.key()).await?;
    }
    Ok(())
}

/// Keys of 1,000 bytes that differ only in their last byte, or only in one byte in the middle,
/// are distinct locks: a store that truncates or hashes a prefix of the key would make them
/// collide.
pub(super) async fn long_keys_are_distinct_over_their_whole_length(ctx: Ctx) -> CaseResult {
    const LEN: usize = 1_000;
    let prefix = ctx.key("");
    let body = LEN - prefix.len() - 1;
    let half = body / 2;
    let keys = [
        format!("{prefix}{}a", "x".repeat(body)),
        format!("{prefix}{}b", "x".repeat(body)),
        format!(
            "{prefix}{}y{}a",
            "x".repeat(half),
            "x".repeat(body - half - 1)
        ),
    ];
    let other = ctx.handle().await;
    let mut leases = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        debug_assert_eq!(key.len(), LEN);
        let lease = ctx
            .store
            .try_acquire(key, ctx.timing.long_ttl)
            .await
            .map_err(|e| {
                Failure(format!(
                    "{LEN}-byte key {i} collided with one that differs only in one byte: {e}"
                ))
            })?;
        ensure!(lease.key() == key, "the lease renamed {LEN}-byte key {i}");
        expect_busy(
            other.try_acquire(key, ctx.timing.long_ttl).await,
            &format!("{LEN}-byte key {i}"),
        )?;
        leases.push(lease);
    }
    for lease in &leases {
        released(&ctx.store, lease, "a long key").await?;
    }
    Ok(())
}

pub(super) async fn max_length_key_is_accepted(ctx: Ctx) -> CaseResult {
    let prefix = ctx.key("");
    let key = format!("{prefix}{}", "é".repeat((MAX_KEY_LEN - prefix.len()) / 2));
    let key = format!("{key}{}", "x".repeat(MAX_KEY_LEN - key.len()));
    let lease = ctx.store.try_acquire(&key, ctx.timing.long_ttl).await?;
    expect_busy(
        ctx.handle()
            .await
            .try_acquire(&key, ctx.timing.long_ttl)
            .await,
        "a maximum-length key",
    )?;
    released(&ctx.store, &lease, "max-length key").await
}

pub(super) async fn over_long_key_is_rejected(ctx: Ctx) -> CaseResult {
    let key = "x".repeat(MAX_KEY_LEN + 1);
    expect_invalid(
        ctx.store.try_acquire(&key, ctx.timing.long_ttl).await,
        "key",
        "a key one byte over the maximum",
    )?;
    expect_invalid(
        ctx.store
            .acquire(&key, ctx.timing.long_ttl, Duration::from_secs(1))
            .await,
        "key",
        "a waiting acquire of an over-long key",
    )
}

pub(super) async fn empty_key_is_rejected(ctx: Ctx) -> CaseResult {
    expect_invalid(
        ctx.store.try_acquire("", ctx.timing.long_ttl).await,
        "key",
        "an empty key",
    )
}
