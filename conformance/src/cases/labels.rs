//! Holder labels: kept beside the holder in every mode, reported by `status`, replaced only by
//! their own lease, and bounded.

use fencelock_core::limits::MAX_LABEL_LEN;
use fencelock_core::{DynLockStore, Error, KeyStatus, Lease, LockStoreExt, Mode};

use super::support::{expect_invalid, released};
use crate::runner::{CaseResult, Failure};
use crate::Ctx;

/// Takes `key` in `mode` with one attempt, labelled.
async fn labelled(
    store: &DynLockStore,
    key: &str,
    ctx: &Ctx,
    mode: Mode,
    label: &str,
) -> Result<Lease, Failure> {
    let lease = store
        .lock(key)
        .ttl(ctx.timing.long_ttl)
        .mode(mode)
        .label(label)
        .lease()
        .await
        .map_err(|e| Failure(format!("a labelled {mode} acquire of a free key: {e}")))?;
    ensure!(
        lease.label().as_deref() == Some(label),
        "a lease asked with label {label:?} carries {:?}",
        lease.label()
    );
    Ok(lease)
}

/// What `status` says of the holder with a lease's token.
enum Reported {
    /// The holder is listed, with this label.
    Label(Option<String>),
    /// The store lists the key's holders without telling which one is this lease.
    Anonymous,
}

async fn reported(store: &DynLockStore, lease: &Lease) -> Result<Reported, Failure> {
    let token = lease.fencing_token();
    match store.status(lease.key()).await? {
        KeyStatus::Held {
            token: held, label, ..
        } if held.is_none_or(|t| t == token) => Ok(Reported::Label(label)),
        KeyStatus::Shared { holders, .. } => {
            match holders.iter().find(|h| h.token == Some(token)) {
                Some(holder) => Ok(Reported::Label(holder.label.clone())),
                None if holders.is_empty() || holders.iter().any(|h| h.token.is_none()) => {
                    Ok(Reported::Anonymous)
                }
                None => Err(Failure(format!(
                    "the status lists no holder with token {token}"
                ))),
            }
        }
        other => Err(Failure(format!(
            "the status of a key held by token {token} is {other:?}"
        ))),
    }
}

/// The label reported for an exclusive holder, which every store must name.
async fn reported_label(store: &DynLockStore, lease: &Lease) -> Result<Option<String>, Failure> {
    match reported(store, lease).await? {
        Reported::Label(label) => Ok(label),
        Reported::Anonymous => Err(Failure(format!(
            "the status does not name the holder with token {}",
            lease.fencing_token()
        ))),
    }
}

pub(super) async fn status_reports_each_holders_label(ctx: Ctx) -> CaseResult {
    let mut modes = vec![Mode::Exclusive];
    if ctx.capabilities.shared {
        modes.push(Mode::Shared);
    }
    if ctx.capabilities.permits {
        modes.push(Mode::Permit { limit: 3 });
    }
    let other = ctx.handle().await;
    for mode in modes {
        let key = ctx.key(&format!("label-{}", mode.to_string().replace(' ', "-")));
        let first = labelled(&ctx.store, &key, &ctx, mode, "host-a pid 4242 ✓").await?;
        let mut leases = vec![(first, "host-a pid 4242 ✓")];
        if mode != Mode::Exclusive {
            let second = labelled(&other, &key, &ctx, mode, "host-b pid 7").await?;
            leases.push((second, "host-b pid 7"));
        }
        // Every holder the status names carries its label; a shared or permit holder it
        // lists without its token (it cannot tell which lease that is) tells nothing, but the
        // status must name at least one of them.
        let mut named = 0;
        for (lease, label) in &leases {
            if let Reported::Label(reported) = reported(&other, lease).await? {
                named += 1;
                ensure!(
                    reported.as_deref() == Some(*label),
                    "a holder in mode {mode} labelled {label:?} is reported with {reported:?}"
                );
            }
        }
        ensure!(
            named > 0,
            "the status of a key held {mode} names none of its holders"
        );
        for (lease, _) in &leases {
            released(&ctx.store, lease, "labelled holder").await?;
        }
        let unlabelled = ctx
            .store
            .try_acquire_as(&key, ctx.timing.long_ttl, mode)
            .await?;
        if let Reported::Label(Some(reported)) = reported(&other, &unlabelled).await? {
            return Err(Failure(format!(
                "an unlabelled {mode} holder is reported with label {reported:?}, left by the one before"
            )));
        }
        released(&ctx.store, &unlabelled, "unlabelled holder").await?;
    }
    Ok(())
}

pub(super) async fn relabel_replaces_the_label_and_is_owner_only(ctx: Ctx) -> CaseResult {
    let key = ctx.key("relabel");
    let other = ctx.handle().await;
    let lease = labelled(&ctx.store, &key, &ctx, Mode::Exclusive, "old").await?;
    ctx.store.relabel(&lease, "new").await?;
    ensure!(
        lease.label().as_deref() == Some("new"),
        "a relabelled lease says {:?}",
        lease.label()
    );
    let reported = reported_label(&other, &lease).await?;
    ensure!(
        reported.as_deref() == Some("new"),
        "after a relabel the status reports {reported:?}"
    );
    released(&ctx.store, &lease, "relabelled holder").await?;
    let next = labelled(&other, &key, &ctx, Mode::Exclusive, "next").await?;
    match ctx.store.relabel(&lease, "stale").await {
        Err(Error::LeaseLost { .. }) => {}
        Ok(()) => return Err(Failure("a relabel by a released lease succeeded".into())),
        Err(other) => {
            return Err(Failure(format!(
                "a relabel by a released lease: expected LeaseLost, got {other}"
            )))
        }
    }
    let reported = reported_label(&other, &next).await?;
    ensure!(
        reported.as_deref() == Some("next"),
        "a stale lease's relabel changed its successor's label to {reported:?}"
    );
    ensure!(
        lease.label().as_deref() == Some("new"),
        "a refused relabel moved the lease's label to {:?}",
        lease.label()
    );
    released(&other, &next, "successor").await
}

pub(super) async fn bad_labels_are_refused_and_nothing_is_held(ctx: Ctx) -> CaseResult {
    let key = ctx.key("bad-label");
    let long = "é".repeat(MAX_LABEL_LEN / 2 + 1);
    for (label, what) in [
        ("", "an empty label"),
        (long.as_str(), "a label over the maximum"),
        ("two\nlines", "a label with a newline"),
    ] {
        let asked = ctx.store.lock(&key).ttl(ctx.timing.long_ttl).label(label);
        expect_invalid(asked.lease().await, "label", what)?;
    }
    let most = "l".repeat(MAX_LABEL_LEN);
    let lease = labelled(&ctx.store, &key, &ctx, Mode::Exclusive, &most).await?;
    match ctx.store.relabel(&lease, &long).await {
        Err(Error::InvalidInput { what: "label", .. }) => {}
        other => {
            return Err(Failure(format!(
                "a relabel over the maximum gave {other:?}, not InvalidInput for the label"
            )))
        }
    }
    released(&ctx.store, &lease, "holder of the longest label").await
}
