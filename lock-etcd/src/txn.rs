//! The etcd transactions, one per atomic step. A `Txn` is built rather than written as text,
//! so each is a function named for its step, with one line on why it is atomic.
//!
//! Extend is not a transaction: the keep-alive renews the lease (etcd answers TTL 0 once it is
//! gone) while a read checks that the entry still exists with its token; both are sent after
//! the lease's `sent_at`.

use crate::handoff::{self, Successor};
use crate::keys;
use crate::offset::Raise;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};
use fencelock_core::{Error, Result};

/// The read of a queue's head: the entry under `dir` with the lowest create revision.
pub(crate) fn queue_head() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Enqueue: put `entry` (with `value`: the mode the request waits in) on `lease_id`, read it
/// back, read the head of `dir` and its two newest entries. Atomic: one transaction at one
/// revision, so "we are first" is decided against exactly the queue the entry joined (and a
/// resent put, which keeps the create revision, decides the same); and when our entry is the
/// newest, the one before it is our predecessor in that same snapshot, so a waiter starts
/// watching it without another read.
///
/// With `raise` ([`Layout::Fencelock`](crate::Layout::Fencelock)), the prefix's token offset
/// is first raised if it is below the raise's threshold (or absent), and read after the put: the
/// offset of the entry's own revision, in the same transaction, so tokens (offset plus create
/// revision) follow create revisions. The head and the newest entries then come with their
/// values, which tell an entry put by a client that mints raw revisions.
///
/// With `label` (a key and the label, [`Layout::Fencelock`](crate::Layout::Fencelock)), the
/// label's own key is put on the same lease in the same step, so no entry is ever seen
/// without the label it was asked with, and the label goes when the entry's lease does. (In
/// [`Layout::Etcd`](crate::Layout::Etcd) the label is `value`.)
pub(crate) fn enqueue(
    dir: &str,
    entry: &str,
    lease_id: i64,
    value: String,
    raise: Option<&Raise>,
    label: Option<(&str, &str)>,
) -> Txn {
    let mut newest = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(2);
    let mut head = queue_head();
    if raise.is_none() {
        newest = newest.with_keys_only();
        head = head.with_keys_only();
    }
    let mut ops = Vec::with_capacity(6);
    if let Some(raise) = raise {
        ops.push(TxnOp::txn(raise_offset(raise)));
    }
    if let Some((key, label)) = label {
        ops.push(TxnOp::put(
            key,
            label,
            Some(PutOptions::new().with_lease(lease_id)),
        ));
    }
    ops.extend([
        TxnOp::put(entry, value, Some(PutOptions::new().with_lease(lease_id))),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
        TxnOp::get(dir, Some(head)),
        TxnOp::get(dir, Some(newest)),
    ]);
    if let Some(raise) = raise {
        ops.push(TxnOp::get(raise.key.as_str(), None));
    }
    Txn::new().and_then(ops)
}

/// Raise the token offset to `raise.target` if it is below `raise.below`, or absent. Only ever
/// upward: the comparison and the put are one step (etcd compares the zero-padded digits byte
/// by byte, which is their numeric order).
fn raise_offset(raise: &Raise) -> Txn {
    let put = || TxnOp::put(raise.key.as_str(), raise.target.as_str(), None);
    // etcd fails a value comparison on an absent key: the else branch creates it.
    let create = Txn::new()
        .when([Compare::version(raise.key.as_str(), CompareOp::Equal, 0)])
        .and_then([put()]);
    Txn::new()
        .when([Compare::value(
            raise.key.as_str(),
            CompareOp::Less,
            raise.below.as_str(),
        )])
        .and_then([put()])
        .or_else([TxnOp::txn(create)])
}

/// The read of a queue's head as of store revision `revision` (keys only): in
/// [`Layout::Etcd`](crate::Layout::Etcd), whether the entry created at `revision` was the
/// oldest then, so granted by its own enqueue at that revision.
pub(crate) fn queue_head_at(revision: i64) -> GetOptions {
    queue_head().with_revision(revision).with_keys_only()
}

/// The offset as of the end of store revision `revision` (a resent enqueue read a later one).
pub(crate) fn offset_at(revision: i64) -> GetOptions {
    GetOptions::new().with_revision(revision)
}

/// Predecessor: the newest entry of `dir` older than `revision`, and `entry` itself; with
/// `successors`, also the oldest entries newer than `revision` (keys only, at most
/// [`handoff::MAX_SUCCESSORS`]), which a holder hands the lock to on release. Atomic: all reads
/// at one revision, so "no predecessor and our entry (and so our lease) still exists" is one
/// snapshot, and the successors listed are, in that snapshot, the entries right behind ours.
pub(crate) fn predecessor(dir: &str, entry: &str, revision: i64, successors: bool) -> Txn {
    let older = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(revision - 1)
        .with_limit(1)
        .with_keys_only();
    let mut reads = vec![
        TxnOp::get(dir, Some(older)),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
    ];
    if successors {
        let newer = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_min_create_revision(revision + 1)
            .with_limit(handoff::MAX_SUCCESSORS)
            .with_keys_only();
        reads.push(TxnOp::get(dir, Some(newer)));
    }
    Txn::new().and_then(reads)
}

/// The newest entry of `[start, end)` older than `revision`, if any.
fn newest_older(end: impl Into<Vec<u8>>, revision: i64) -> GetOptions {
    GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(revision - 1)
        .with_limit(1)
}

/// A reader's view: the newest older entry that is not a reader's (keys only), the newest
/// older reader (with its value), and `entry` itself. Atomic: all three at one revision, so
/// "no older writer, the newest older reader granted, and our entry still there" is one
/// snapshot.
pub(crate) fn reader_view(dir: &str, entry: &str, revision: i64) -> Txn {
    let (readers, readers_end) = keys::shared_range(dir);
    Txn::new().and_then([
        TxnOp::get(
            dir,
            Some(newest_older(keys::not_shared_end(dir), revision).with_keys_only()),
        ),
        TxnOp::get(readers, Some(newest_older(readers_end, revision))),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
    ])
}

/// A permit's view: every entry of `dir` older than `revision` with its value (oldest
/// first), and `entry` itself. Atomic: one snapshot of the queue ahead of us.
pub(crate) fn permit_view(dir: &str, entry: &str, revision: i64) -> Txn {
    let older = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_max_create_revision(revision - 1);
    Txn::new().and_then([
        TxnOp::get(dir, Some(older)),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
    ])
}

/// Grant: rewrite `entry`'s value to `value` (on its own lease, keeping its create revision)
/// only if its create revision is still `revision`. Atomic: compare and put in one
/// transaction, so only a live entry is marked granted, and never a successor's entry.
pub(crate) fn mark(entry: &str, revision: i64, value: String, lease_id: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
        .and_then([TxnOp::put(
            entry,
            value,
            Some(PutOptions::new().with_lease(lease_id)),
        )])
}

/// Every entry of a queue, oldest first, with values (status).
pub(crate) fn whole_queue() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// Status in [`Layout::Fencelock`](crate::Layout::Fencelock): the whole queue of `dir` and
/// every label of `labels`. Atomic: both reads at one revision, so each holder is reported
/// with the label it had then.
pub(crate) fn queue_and_labels(dir: &str, labels: &str) -> Txn {
    Txn::new().and_then([
        TxnOp::get(dir, Some(whole_queue())),
        TxnOp::get(labels, Some(GetOptions::new().with_prefix())),
    ])
}

/// Relabel (etcd's `Election.Proclaim`): put `label` into `key` (the entry itself in
/// [`Layout::Etcd`](crate::Layout::Etcd), its label key in
/// [`Layout::Fencelock`](crate::Layout::Fencelock)) on the holder's lease, only if `entry`'s
/// create revision is still `revision`. Atomic: compare and put in one transaction, so a
/// holder whose entry is gone never labels its successor, or leaves a label behind.
pub(crate) fn relabel(entry: &str, revision: i64, key: &str, label: &str, lease_id: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
        .and_then([TxnOp::put(
            key,
            label,
            Some(PutOptions::new().with_lease(lease_id)),
        )])
}

/// Release (and the operator's evict): delete `entry` only if its create revision is still
/// `revision`, the one the holder's grant saw (its token is the offset plus it). Atomic: compare and delete in one transaction, so a retried
/// stale unlock never deletes a newer holder (as etcd's own lock service once did).
///
/// With `label` (the holder's label key, [`Layout::Fencelock`](crate::Layout::Fencelock)), it
/// goes in the same step: the etcd lease it is on is kept for the next lock.
pub(crate) fn delete_if_created_at(
    entry: impl Into<Vec<u8>>,
    revision: i64,
    label: Option<&str>,
) -> Txn {
    let entry = entry.into();
    let mut deletes = vec![TxnOp::delete(entry.clone(), None)];
    deletes.extend(label.map(|key| TxnOp::delete(key, None)));
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
        .and_then(deletes)
}

/// Release with a handoff: if `entry` still has create revision `revision` (the one the
/// holder's grant saw), delete it and, if `next` (the holder's successor in `dir`) still exists with the
/// create revision and lease it was read with, rewrite its value to `mark` on that same lease.
/// Atomic: one transaction, so the mark is written exactly when the holder's entry goes and
/// its successor is still queued, at the revision that frees the lock. Without the successor,
/// it is the plain compare-and-delete. The outer comparison decides whether anything was
/// deleted, as for [`delete_if_created_at`].
/// The holder's `label` key goes with its entry, as in [`delete_if_created_at`].
pub(crate) fn release_to(
    entry: &str,
    revision: i64,
    dir: &str,
    next: &Successor,
    mark: String,
    label: Option<&str>,
) -> Txn {
    let next_key = next.key(dir);
    let own = || {
        let mut deletes = vec![TxnOp::delete(entry, None)];
        deletes.extend(label.map(|key| TxnOp::delete(key, None)));
        deletes
    };
    let hand_off = Txn::new()
        .when([
            Compare::create_revision(next_key.clone(), CompareOp::Equal, next.created),
            Compare::lease(next_key.clone(), CompareOp::Equal, next.lease_id),
        ])
        .and_then(
            own()
                .into_iter()
                .chain([TxnOp::put(
                    next_key,
                    mark,
                    Some(PutOptions::new().with_lease(next.lease_id)),
                )])
                .collect::<Vec<_>>(),
        )
        .or_else(own());
    Txn::new()
        .when([Compare::create_revision(entry, CompareOp::Equal, revision)])
        .and_then([TxnOp::txn(hand_off)])
}

/// The key-values of each read in a transaction's answer, in order.
pub(crate) fn gets(answer: &TxnResponse) -> Vec<Vec<KeyValue>> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        })
        .collect()
}

/// The holder's fencing token in [`Layout::Etcd`](crate::Layout::Etcd): the store revision of the reply that showed
/// our entry as the queue's head, which is what etcd's `Mutex` keeps as its `Header()` and
/// `etcdctl lock` exports as `ETCD_LOCK_REV`.
pub(crate) fn answered_at(answer: &TxnResponse) -> Result<i64> {
    answer
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| Error::Store {
            message: "etcd answered a transaction without a header".into(),
            source: None,
        })
}
