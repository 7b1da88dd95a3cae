//! Rule 4 (unavailability) on histories recorded from real runs (`tests/fixtures/README.md`
//! says how each was recorded): no server is started, so this takes milliseconds.

use nemesis::history::Entry;
use nemesis::resource::ResourceState;
use nemesis::{check, faults, Verdict};

const TTL_MS: u64 = 1000;

/// A fixture's history, checked as the run checks its store's. The resource is left empty:
/// a trimmed window's writes cannot be matched against a counter, and rule 4 needs none.
fn check_fixture(name: &str, store: &str) -> Verdict {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let history: Vec<Entry> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect();
    check(
        &history,
        &ResourceState::default(),
        TTL_MS,
        faults::delays_of(store),
    )
}

/// PostgreSQL before its fix of frozen readers: a reader frozen while it waited in the server's
/// queue behind a writer holds the key's lock shared with no server-side limit; the exclusive
/// worker's wait queues behind it and the permit worker's behind that, so no one is granted
/// until the reader resumes.
#[test]
fn a_frozen_shared_waiter_on_postgres_before_the_fix_breaks_rule_4() {
    let verdict = check_fixture("postgres-frozen-shared-waiter.jsonl", "postgres");
    assert!(verdict.broke(4), "{:#?}", verdict.violations);
    // And rule 6 (`a_permit_waiter_on_postgres_before_the_fix_is_passed_by_a_writer`).
    assert!(
        verdict
            .violations
            .iter()
            .all(|v| v.rule == 4 || v.rule == 6),
        "{:#?}",
        verdict.violations
    );
    let v = verdict.violations.iter().find(|v| v.rule == 4).unwrap();
    assert!(v.summary.contains("worker 1 (exclusive"), "{}", v.summary);
    assert!(
        v.excerpt[0].contains("pause-waiter"),
        "the excerpt starts at the fault: {:#?}",
        v.excerpt
    );
    assert!(verdict.total().longest_wait_ttl > verdict.bound_ttl);
}

/// The memory store under the same fault: a frozen waiter's grant runs out at its TTL, and the
/// others are served within the bound.
#[test]
fn a_frozen_shared_waiter_on_the_memory_store_keeps_rule_4() {
    let verdict = check_fixture("memory-frozen-shared-waiter.jsonl", "memory");
    assert!(verdict.is_safe(), "{:#?}", verdict.violations);
    let longest = verdict.total().longest_wait_ttl;
    assert!(longest > 0.5 && longest < verdict.bound_ttl, "{longest}");
}

/// The same PostgreSQL history, read for the queue's order: the permit worker 3, waiting
/// behind readers with no fault of its own, is passed by the writer, worker 1, which asked
/// seconds after it (a reader or permit waiter then polled its blocking group's lock, and
/// neither kept later requests out).
#[test]
fn a_permit_waiter_on_postgres_before_the_fix_is_passed_by_a_writer() {
    let verdict = check_fixture("postgres-frozen-shared-waiter.jsonl", "postgres");
    let passed: Vec<_> = verdict.violations.iter().filter(|v| v.rule == 6).collect();
    assert!(!passed.is_empty(), "{:#?}", verdict.violations);
    assert!(
        passed[0].summary.contains("worker 3 (permit of 2")
            && passed[0].summary.contains("worker 1 (exclusive"),
        "{}",
        passed[0].summary
    );
}

/// Whether a fixture breaks rule 6 with a reader among the waiters passed.
fn a_reader_is_passed(name: &str, store: &str) {
    let verdict = check_fixture(name, store);
    let passed: Vec<_> = verdict.violations.iter().filter(|v| v.rule == 6).collect();
    assert!(!passed.is_empty(), "{:#?}", verdict.violations);
    assert!(
        passed.iter().any(|v| v.summary.contains("(shared, lease")),
        "{passed:#?}"
    );
}

/// The memory store before its queue was fair across modes (seed 7, 8 workers): the reader,
/// worker 2, waits from the run's start, and again once its wait ran out, while permit
/// holders keep the key among themselves; permits asked seconds after it are granted first.
#[test]
fn a_reader_starved_by_permits_on_the_memory_store_before_the_fix_breaks_rule_6() {
    a_reader_is_passed("memory-starved-reader.jsonl", "memory");
}

/// The same on Redis before its queue was fair: readers (and writers) passed by permits.
#[test]
fn a_reader_starved_by_permits_on_redis_before_the_fix_breaks_rule_6() {
    a_reader_is_passed("redis-starved-reader.jsonl", "redis");
}
