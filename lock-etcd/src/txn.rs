//! The etcd transactions, one per atomic step. A `Txn` is built rather than written as text,
//! so each is a function named for its step, with one line on why it is atomic.
//!
//! Extend is not a transaction: the keep-alive renews the lease (etcd answers TTL 0 once it is
//! gone) while a read checks that the entry still exists with its token; both are sent after
//! the lease's `sent_at`.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

/// The read of a queue's head: the entry under `dir` with the lowest create revision.
pub(crate) fn queue_head() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Enqueue: put `entry` on `lease_id`, read it back and read the head of `dir`. Atomic: one
/// transaction at one revision, so "we are first" is decided against exactly the queue the
/// entry joined (and a resent put, which keeps the create revision, decides the same).
pub(crate) fn enqueue(dir: &str, entry: &str, lease_id: i64) -> Txn {
    Txn::new().and_then([
        TxnOp::put(entry, "", Some(PutOptions::new().with_lease(lease_id))),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
        TxnOp::get(dir, Some(queue_head().with_keys_only())),
    ])
}

/// Predecessor: the newest entry of `dir` older than `revision`, and `entry` itself. Atomic:
/// both reads at one revision, so "no predecessor and our entry (and so our lease) still
/// exists" is one snapshot.
pub(crate) fn predecessor(dir: &str, entry: &str, revision: i64) -> Txn {
    let older = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(revision - 1)
        .with_limit(1)
        .with_keys_only();
    Txn::new().and_then([
        TxnOp::get(dir, Some(older)),
        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
    ])
}

/// Release (and the operator's evict): delete `entry` only if its create revision is still
/// `revision`, the holder's token. Atomic: compare and delete in one transaction, so a retried
/// stale unlock never deletes a newer holder (etcd issue 22082).
pub(crate) fn delete_if_created_at(entry: impl Into<Vec<u8>>, revision: i64) -> Txn {
    let entry = entry.into();
    Txn::new()
        .when([Compare::create_revision(
            entry.clone(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::delete(entry, None)])
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
