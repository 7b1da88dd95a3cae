//! Listing: the keys held under a prefix, in every mode the store keeps, with their holders'
//! labels; none outside it, none released or expired; every key across pages.

use std::collections::BTreeMap;

use fencelock_core::limits::MAX_KEY_LEN;
use fencelock_core::{DynLockStore, KeyStatus, Lease, ListCursor, LockStoreExt, Mode};

use super::support::{expect_invalid, outlive, released, short_lease};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// Every page of `prefix`'s listing, `limit` names a page: each key with its status, and how
/// many times it was listed.
async fn listed(
    store: &DynLockStore,
    prefix: &str,
    limit: usize,
) -> Result<BTreeMap<String, (KeyStatus, usize)>, Failure> {
    let mut seen: BTreeMap<String, (KeyStatus, usize)> = BTreeMap::new();
    let mut from: Option<ListCursor> = None;
    for _ in 0..10_000 {
        let page = store.list(prefix, from.as_ref(), limit).await?;
        for held in page.keys {
            ensure!(
                held.status != KeyStatus::Free,
                "the listing names {:?} as free",
                held.key
            );
            seen.entry(held.key)
                .and_modify(|(_, times)| *times += 1)
                .or_insert((held.status, 1));
        }
        match page.next {
            Some(next) => from = Some(next),
            None => return Ok(seen),
        }
    }
    Err(Failure(format!(
        "the listing of {prefix:?} did not end after 10,000 pages"
    )))
}

/// Takes `key` in `mode`, labelled where the store keeps labels.
async fn take(ctx: &Ctx, key: &str, mode: Mode, label: &str) -> Result<Lease, Failure> {
    let mut request = ctx.store.lock(key).ttl(ctx.timing.long_ttl).mode(mode);
    if ctx.capabilities.labels {
        request = request.label(label);
    }
    Ok(request.lease().await?)
}

/// The mode and labels a status reports.
fn shown(status: &KeyStatus) -> (Mode, Vec<Option<String>>) {
    match status {
        KeyStatus::Held { label, .. } => (Mode::Exclusive, vec![label.clone()]),
        KeyStatus::Shared { mode, holders, .. } => {
            (*mode, holders.iter().map(|h| h.label.clone()).collect())
        }
        _ => (Mode::Exclusive, Vec::new()),
    }
}

pub(super) async fn a_listing_shows_exactly_the_held_keys_under_its_prefix(ctx: Ctx) -> CaseResult {
    let prefix = ctx.key("listed/");
    // A key that shares all of the prefix but its last byte, and one whose lease is gone.
    let outside = ctx.key("listed-outside");
    let mut wanted: Vec<(String, Mode)> = vec![(format!("{prefix}exclusive"), Mode::Exclusive)];
    if ctx.capabilities.shared {
        wanted.push((format!("{prefix}shared"), Mode::Shared));
    }
    if ctx.capabilities.permits {
        wanted.push((format!("{prefix}permit"), Mode::permits(3)));
    }
    let mut leases = Vec::new();
    for (key, mode) in &wanted {
        leases.push(take(&ctx, key, *mode, &format!("holder of {key}")).await?);
    }
    let other = take(&ctx, &outside, Mode::Exclusive, "outside").await?;
    let gone = take(&ctx, &format!("{prefix}released"), Mode::Exclusive, "gone").await?;
    released(&ctx.store, &gone, "a key released before the listing").await?;
    let (expired, _) = short_lease(&ctx, &format!("{prefix}expired")).await?;
    outlive(&ctx, &expired).await;

    let seen = listed(&ctx.handle().await, &prefix, 1000).await?;
    let names: Vec<&String> = seen.keys().collect();
    let want: Vec<&String> = wanted.iter().map(|(key, _)| key).collect::<Vec<_>>();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    ensure!(
        names == want_sorted,
        "the listing of {prefix:?} names {names:?}, not the keys held under it {want_sorted:?}"
    );
    for (key, mode) in &wanted {
        let (status, times) = &seen[key];
        ensure!(*times == 1, "{key:?} is listed {times} times in one page");
        let (listed_mode, labels) = shown(status);
        ensure!(
            listed_mode == *mode,
            "{key:?} is listed as held {listed_mode}, not {mode}"
        );
        if ctx.capabilities.labels {
            let label = format!("holder of {key}");
            ensure!(
                labels.iter().any(|l| l.as_deref() == Some(label.as_str())),
                "{key:?} is listed with labels {labels:?}, not {label:?}"
            );
        }
    }
    for lease in leases.iter().chain([&other]) {
        released(&ctx.store, lease, "a listed key's holder").await?;
    }
    let after = listed(&ctx.store, &prefix, 1000).await?;
    ensure!(
        after.is_empty(),
        "released keys are still listed: {:?}",
        after.keys().collect::<Vec<_>>()
    );
    Ok(())
}

pub(super) async fn a_listing_pages_through_every_held_key(ctx: Ctx) -> CaseResult {
    let prefix = ctx.key("paged/");
    let keys: Vec<String> = (0..7).map(|i| format!("{prefix}{i:02}")).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(ctx.store.try_acquire(key, ctx.timing.long_ttl).await?);
    }
    let seen = listed(&ctx.handle().await, &prefix, 2).await?;
    let names: Vec<&String> = seen.keys().collect();
    let want: Vec<&String> = keys.iter().collect();
    ensure!(
        names == want,
        "pages of 2 list {names:?}, not every key held throughout {want:?}"
    );
    for lease in &leases {
        released(&ctx.store, lease, "a paged key's holder").await?;
    }
    Ok(())
}

pub(super) async fn bad_listing_input_is_refused(ctx: Ctx) -> CaseResult {
    let over = "k".repeat(MAX_KEY_LEN + 1);
    expect_invalid(
        ctx.store.list(&over, None, 10).await,
        "prefix",
        "a prefix over the key limit",
    )?;
    expect_invalid(
        ctx.store.list("", None, 0).await,
        "limit",
        "a listing of zero names a page",
    )
}
