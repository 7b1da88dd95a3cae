//! The checker: reads a whole history and the resource's end state, and proves (or refutes)
//! that nothing unsafe was accepted.
//!
//! Violations (any one fails the run). The fenced rows are the exclusive holders' fenced row
//! and each permit slot's row (one fence per slot).
//!
//! 1. **Stale write accepted**: each fenced row's accepted writes, in the order the resource
//!    accepted them (its log's serial ids), must carry strictly increasing tokens; and tokens
//!    grow across every mode: a lease asked for after another was granted has a greater token.
//! 2. **Lost update**: each fenced counter equals the number of its accepted writes, and each
//!    accepted write read the value the previous one wrote.
//! 3. **A second holder let in** while a conflicting lease still held the key by the contract
//!    (no exclusive lease next to any other, no reader next to a permit, at most `limit`
//!    permits, each in its own slot below the limit). Seen two ways:
//!    - *an unexplained refusal*: a refused claim, write or reader's read on a fenced row
//!      whose lease was not lost: its lost signal had not fired, its local deadline had not
//!      passed, and no fault the store documents as freeing locks early hit it (the fault
//!      began before the refusal and ended after the lease's grant);
//!    - *a conflicting grant*: a lease granted (its answer received) while a conflicting lease
//!      was held: from its grant until its last known local deadline, its release's sending,
//!      its lost signal or its worker's kill, whichever came first, and not hit by a fault
//!      that frees locks early.
//! 4. **Unavailability**: while a worker that is not paused or cut off waits for the key, the
//!    key is granted to someone within the store's bound ([`crate::delays`]: two TTLs plus
//!    the store's documented delays), counted from the last grant, the start of the last
//!    client fault (pause, kill, cut), or the end of the last store fault the store documents
//!    as making it unavailable; the rule is off while such a fault is in progress.
//! 5. **An observer behind**: the controller's observer of the election on the key (its own
//!    connection, which no client fault touches) never yields a term below one it yielded,
//!    and sees every leadership that led for at least twice its bound within that bound of
//!    the grant: [`observer_bound`], the store's status poll (100 ms) plus a quarter of the
//!    TTL (an answer slower than that already fails a keep-alive's extend). Off while a store
//!    fault is in progress, and before the observer's first read.
//! 6. **A waiter passed**: on a store whose docs promise a fair queue
//!    ([`crate::delays::Order`]), no request asked at least [`QUEUE_SETTLE`] after a waiter
//!    asked (from the waiter's worker's second request on), in a mode the queue orders after
//!    the waiter's (every pair but two readers; on
//!    PostgreSQL only pairs with a writer), is granted before it while the waiter waits, is
//!    not paused, cut off or killed, and no store fault is in progress. On the other stores a
//!    waiter can be passed without bound by their docs; rule 4 still bounds how long no one is
//!    granted.
//!
//! Counted, not failed: critical sections of conflicting modes that overlapped in real time,
//! updates lost on the row checked only at the write and on the unfenced shadow row (expected
//! under pauses), lost signals, for each fault the time until the next grant, and rule 4's
//! longest unserved wait, in TTLs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::delays::StoreDelays;
use crate::fault::Fault;
use crate::history::{Entry, Event, Row, WorkMode};
use crate::resource::{Accepted, ResourceState};

/// What the checker found in one store's run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Per fault kind (the window from a fault until the next one; `none` before the first),
    /// and `all` for the whole run.
    pub by_kind: BTreeMap<String, Stats>,
    /// Per mode of the workers (`exclusive`, `shared`, `permit of 2`).
    pub by_mode: BTreeMap<String, Stats>,
    /// Rule 4's bound, in TTLs.
    pub bound_ttl: f64,
    /// Every violation, each with the history excerpt that shows it.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// Whether no rule was broken.
    pub fn is_safe(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether some violation broke `rule` (1 to 6).
    pub fn broke(&self, rule: u8) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }

    /// The figures of the whole run.
    pub fn total(&self) -> Stats {
        self.by_kind.get(ALL).cloned().unwrap_or_default()
    }
}

/// The figures of one window (or of the whole run).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Faults of this kind injected.
    pub faults: u64,
    /// Leases granted.
    pub acquisitions: u64,
    /// Writes the fenced row accepted.
    pub writes_accepted: u64,
    /// Claims and writes the fenced row refused.
    pub stale_refused: u64,
    /// Writes the fenced row accepted out of token order (must be 0).
    pub stale_accepted: u64,
    /// Critical sections (grant to the last read or write) that overlapped another in real
    /// time.
    pub overlaps: u64,
    /// Writes to the row checked only at the write whose increment the final value lacks,
    /// counted in the window of the lease that wrote them.
    pub lost_write_only: u64,
    /// The same on the unfenced shadow row.
    pub lost_shadow: u64,
    /// Lost signals fired by keep-alives.
    pub lost_signals: u64,
    /// The longest time from a fault of this kind to the next grant, in TTLs.
    pub worst_unavailable_ttl: f64,
    /// Rule 4's measure: the longest a worker that was not paused waited with no grant to
    /// anyone, counted as rule 4 counts, in TTLs (attributed to the window it ended in).
    pub longest_wait_ttl: f64,
}

/// A broken rule, with the part of the history that shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// 1 stale write accepted, 2 lost update, 3 second holder let in, 4 unavailability, 5 an
    /// observer behind, 6 a waiter passed.
    pub rule: u8,
    /// What is wrong, in one line.
    pub summary: String,
    /// The entries of the leases involved (and faults meanwhile), one JSON object per line.
    pub excerpt: Vec<String>,
}

/// How soon the observer must yield a new leader (rule 5): the store's status poll (100 ms,
/// [`fencelock::Capabilities::DEFAULT_STATUS_POLL`]; a store with notification is sooner) plus a
/// quarter of the TTL, the keep-alive's own extend period, which a store answering more slowly
/// already fails.
pub fn observer_bound(ttl_ms: u64) -> Duration {
    fencelock::Capabilities::DEFAULT_STATUS_POLL + Duration::from_millis(ttl_ms / 4)
}

/// How long after a waiter asked a later request must have asked for rule 6 to order the two:
/// the waiter's first attempt has reached the store by then (the conformance case's settle,
/// outside faults).
pub const QUEUE_SETTLE: Duration = Duration::from_millis(250);

/// A history time (ns from the run's start) in seconds.
fn secs(t: u64) -> f64 {
    t as f64 / 1e9
}

/// The window name of the whole run.
pub const ALL: &str = "all";
/// The window name before the first fault.
pub const NONE: &str = "none";

/// Checks a history (ordered by time) against the resource's end state. `ttl_ms` is the
/// lease TTL the workers asked for; `delays` the store's row of the fault table ([`crate::faults::delays_of`]).
pub fn check(
    history: &[Entry],
    resource: &ResourceState,
    ttl_ms: u64,
    delays: &StoreDelays,
) -> Verdict {
    let index = Index::new(history);
    let mut tally = Tally::default();
    let mut violations = tally.count_events(&index, ttl_ms);

    violations.extend(index.tokens_not_growing());
    violations.extend(index.conflicting_grants());
    violations.extend(index.observer_behind(ttl_ms));
    violations.extend(index.passed_waiters(delays));

    // Rules 1 and 2 from the resource's own order of each fenced row's writes.
    for (row, value) in fenced_rows(resource) {
        violations.extend(tally.check_fenced_row(&index, resource, row, value));
    }
    tally.count_lost_updates(&index, resource);

    for (kind, mode, overlaps) in index.overlaps() {
        tally.bump(kind, Some(mode), &|s| s.overlaps += overlaps);
    }

    let ttl = Duration::from_millis(ttl_ms);
    let bound = delays.bound(ttl);
    violations.extend(tally.measure_waits(&index, delays, ttl_ms, bound));

    let Tally {
        mut by_kind,
        by_mode,
    } = tally;
    by_kind.entry(ALL.to_string()).or_default();
    Verdict {
        by_kind,
        by_mode,
        bound_ttl: bound.as_secs_f64() * 1000.0 / ttl_ms.max(1) as f64,
        violations,
    }
}

/// The fenced rows and their final counters: the exclusive holders' row, each permit slot's
/// row, and any other fenced row the resource accepted a write on (its counter taken as 0).
fn fenced_rows(resource: &ResourceState) -> Vec<(Row, i64)> {
    let mut rows: Vec<(Row, i64)> = vec![(Row::Fenced, resource.fenced)];
    rows.extend(resource.slots.iter().map(|(&s, &v)| (Row::Slot(s), v)));
    for row in resource.accepted.iter().map(|w| w.row) {
        if row.is_fenced() && !rows.iter().any(|(r, _)| *r == row) {
            rows.push((row, 0));
        }
    }
    rows
}

/// The figures the checker counts, per fault window (and the whole run) and per mode.
#[derive(Default)]
struct Tally {
    by_kind: BTreeMap<String, Stats>,
    by_mode: BTreeMap<String, Stats>,
}

impl Tally {
    /// Applies `f` to the figures of window `kind`, of the whole run, and of `mode` if known.
    fn bump(&mut self, kind: &str, mode: Option<WorkMode>, f: &dyn Fn(&mut Stats)) {
        f(self.by_kind.entry(kind.to_string()).or_default());
        f(self.by_kind.entry(ALL.to_string()).or_default());
        if let Some(mode) = mode {
            f(self.by_mode.entry(mode.name()).or_default());
        }
    }

    /// Counts the history's grants, lost signals, faults and refusals on fenced rows, each in
    /// its window; a refusal its lease's loss does not explain is a violation (rule 3).
    fn count_events(&mut self, index: &Index<'_>, ttl_ms: u64) -> Vec<Violation> {
        let mut violations = Vec::new();
        for entry in index.history {
            let kind = index.window(entry.t);
            let mode = entry
                .event
                .lease()
                .and_then(|l| index.modes.get(&(entry.worker, l)).copied());
            match &entry.event {
                Event::Grant { .. } => self.bump(kind, mode, &|s| s.acquisitions += 1),
                Event::Lost { .. } => self.bump(kind, mode, &|s| s.lost_signals += 1),
                Event::Fault { kind, .. } => {
                    let unavailable = index.unavailable_ttl(entry.t, ttl_ms);
                    self.bump(kind, None, &|s| {
                        s.faults += 1;
                        s.worst_unavailable_ttl = s.worst_unavailable_ttl.max(unavailable);
                    });
                }
                Event::Read {
                    row, value: None, ..
                }
                | Event::Write {
                    row, log_id: None, ..
                } if row.is_fenced() => {
                    self.bump(kind, mode, &|s| s.stale_refused += 1);
                    if let Some(v) = index.unexplained_refusal(entry) {
                        violations.push(v);
                    }
                }
                _ => {}
            }
        }
        violations
    }

    /// Checks fenced `row`'s accepted writes in the resource's order, its counter at `value`:
    /// tokens strictly growing (rule 1), each write reading what the one before it wrote, and
    /// the counter equal to their number (rule 2).
    fn check_fenced_row(
        &mut self,
        index: &Index<'_>,
        resource: &ResourceState,
        row: Row,
        value: i64,
    ) -> Vec<Violation> {
        let mut violations = Vec::new();
        let mut highest: Option<&Accepted> = None;
        let mut current = 0i64;
        let mut fenced_writes = 0i64;
        for write in resource.accepted.iter().filter(|w| w.row == row) {
            let kind = index.window_of_lease(write.worker, write.lease);
            let mode = index.modes.get(&(write.worker, write.lease)).copied();
            fenced_writes += 1;
            self.bump(kind, mode, &|s| s.writes_accepted += 1);
            if let Some(prev) = highest.filter(|p| write.token <= p.token) {
                self.bump(kind, mode, &|s| s.stale_accepted += 1);
                violations.push(Violation {
                    rule: 1,
                    summary: format!(
                        "stale write accepted on row {row:?}: log id {} (worker {} lease {} token {}) after log id {} (worker {} lease {} token {})",
                        write.id, write.worker, write.lease, write.token,
                        prev.id, prev.worker, prev.lease, prev.token
                    ),
                    excerpt: index.excerpt(&[(prev.worker, prev.lease), (write.worker, write.lease)]),
                });
            }
            if highest.is_none_or(|p| write.token > p.token) {
                highest = Some(write);
            }
            if write.read_value != current {
                violations.push(Violation {
                    rule: 2,
                    summary: format!(
                        "lost update on row {row:?}: log id {} (worker {} lease {} token {}) read {} but the counter held {}",
                        write.id, write.worker, write.lease, write.token, write.read_value, current
                    ),
                    excerpt: index.excerpt(&[(write.worker, write.lease)]),
                });
            }
            current = write.new_value;
        }
        if value != fenced_writes {
            let last: Vec<(u32, u64)> = resource
                .accepted
                .iter()
                .rev()
                .filter(|a| a.row == row)
                .take(2)
                .map(|a| (a.worker, a.lease))
                .collect();
            violations.push(Violation {
                rule: 2,
                summary: format!(
                    "lost update: the counter of row {row:?} is {value} but the resource accepted {fenced_writes} writes",
                ),
                excerpt: index.excerpt(&last),
            });
        }
        violations
    }

    /// Counts the other rows' lost updates: the writes whose increment the final value does
    /// not contain. Walking back from the final value, each surviving write is the latest one
    /// that wrote the value its successor read; every other write was overwritten.
    fn count_lost_updates(&mut self, index: &Index<'_>, resource: &ResourceState) {
        for (row, last) in [
            (Row::WriteOnly, resource.write_only),
            (Row::Shadow, resource.shadow),
        ] {
            let mut wanted = last;
            for write in resource.accepted.iter().rev().filter(|w| w.row == row) {
                if write.new_value == wanted {
                    wanted = write.read_value;
                    continue;
                }
                let kind = index.window_of_lease(write.worker, write.lease);
                let mode = index.modes.get(&(write.worker, write.lease)).copied();
                match row {
                    Row::WriteOnly => self.bump(kind, mode, &|s| s.lost_write_only += 1),
                    _ => self.bump(kind, mode, &|s| s.lost_shadow += 1),
                }
            }
        }
    }

    /// Measures rule 4 on every unserved wait, in TTLs; a wait longer than `bound` is a
    /// violation, one per stall (its clock's start), however many waited through it.
    fn measure_waits(
        &mut self,
        index: &Index<'_>,
        delays: &StoreDelays,
        ttl_ms: u64,
        bound: Duration,
    ) -> Vec<Violation> {
        let mut violations = Vec::new();
        let in_ttls = |ns: u64| ns as f64 / 1e6 / ttl_ms.max(1) as f64;
        let waits = index.unserved_waits(delays);
        let mut reported_stalls = Vec::new();
        for wait in &waits {
            let measure = in_ttls(wait.longest);
            self.bump(index.window(wait.at), Some(wait.mode), &|s| {
                s.longest_wait_ttl = s.longest_wait_ttl.max(measure)
            });
            if wait.longest > crate::clock::nanos(bound) && !reported_stalls.contains(&wait.since) {
                reported_stalls.push(wait.since);
                violations.push(index.unavailability(wait, in_ttls, bound));
            }
        }
        violations
    }
}

/// Rule 4's measure of one eligible stretch of one worker's wait.
#[derive(Debug, Clone)]
struct UnservedWait {
    worker: u32,
    lease: u64,
    mode: WorkMode,
    /// The longest time with no grant counted as rule 4 counts (ns).
    longest: u64,
    /// Where that longest time began (a grant, a client fault's start, an unavailability's end).
    since: u64,
    /// Where it ended.
    at: u64,
}

/// A lease's hold by the contract, as the history shows it.
#[derive(Debug, Clone, Copy)]
struct Held {
    worker: u32,
    lease: u64,
    mode: WorkMode,
    slot: Option<u32>,
    token: u64,
    granted: u64,
    until: u64,
}

/// Lookups over one history.
struct Index<'h> {
    history: &'h [Entry],
    /// (t, kind) of each fault, in time order.
    faults: Vec<(u64, &'h str)>,
    grants: HashMap<(u32, u64), u64>,
    lost_at: HashMap<(u32, u64), u64>,
    grant_times: Vec<u64>,
    /// When each fault was healed, by fault id.
    healed: HashMap<u32, u64>,
    /// Each lease's mode, from its acquire and its grant.
    modes: HashMap<(u32, u64), WorkMode>,
    /// When each worker was killed.
    killed: HashMap<u32, u64>,
    /// When each lease's release was answered.
    released: HashMap<(u32, u64), u64>,
    /// Where rule 4 stops looking: the controller's stop, or the end of the history.
    end: u64,
}

impl<'h> Index<'h> {
    fn new(history: &'h [Entry]) -> Self {
        let mut index = Index {
            history,
            faults: Vec::new(),
            grants: HashMap::new(),
            lost_at: HashMap::new(),
            grant_times: Vec::new(),
            healed: HashMap::new(),
            modes: HashMap::new(),
            killed: HashMap::new(),
            released: HashMap::new(),
            end: history.last().map_or(0, |e| e.t),
        };
        for e in history {
            match &e.event {
                Event::Fault { kind, target, .. } => {
                    index.faults.push((e.t, kind));
                    if let (Some(Fault::Kill), Some(w)) = (Fault::parse(kind), target) {
                        index.killed.entry(*w).or_insert(e.t);
                    }
                }
                Event::Acquire { lease, mode } => {
                    index.modes.insert((e.worker, *lease), *mode);
                }
                Event::Stop => index.end = index.end.min(e.t),
                Event::Grant { lease, mode, .. } => {
                    index.grants.insert((e.worker, *lease), e.t);
                    index.grant_times.push(e.t);
                    index.modes.insert((e.worker, *lease), *mode);
                }
                Event::Lost { lease, .. } => {
                    index.lost_at.entry((e.worker, *lease)).or_insert(e.t);
                }
                Event::Healed { id } => {
                    index.healed.insert(*id, e.t);
                }
                Event::Release { lease, .. } => {
                    index.released.insert((e.worker, *lease), e.t);
                }
                _ => {}
            }
        }
        index
    }

    /// The kind of the last fault at or before `t`.
    fn window(&self, t: u64) -> &'h str {
        let i = self.faults.partition_point(|&(ft, _)| ft <= t);
        if i == 0 {
            NONE
        } else {
            self.faults[i - 1].1
        }
    }

    fn window_of_lease(&self, worker: u32, lease: u64) -> &'h str {
        self.grants
            .get(&(worker, lease))
            .map_or(NONE, |&t| self.window(t))
    }

    /// From a fault at `t` to the next grant (or the end of the history), in TTLs.
    fn unavailable_ttl(&self, t: u64, ttl_ms: u64) -> f64 {
        let next = self
            .grant_times
            .iter()
            .copied()
            .find(|&g| g > t)
            .or_else(|| self.history.last().map(|e| e.t))
            .unwrap_or(t);
        (next.saturating_sub(t)) as f64 / 1e6 / ttl_ms.max(1) as f64
    }

    /// Rule 3 for one refused claim or write.
    fn unexplained_refusal(&self, refusal: &Entry) -> Option<Violation> {
        let (lease, token, deadline, lost, row) = match &refusal.event {
            Event::Read {
                lease,
                token,
                deadline,
                lost,
                row,
                ..
            }
            | Event::Write {
                lease,
                token,
                deadline,
                lost,
                row,
                ..
            } => (*lease, *token, *deadline, *lost, *row),
            _ => return None,
        };
        let key = (refusal.worker, lease);
        let signalled = lost || self.lost_at.get(&key).is_some_and(|&l| l <= refusal.t);
        let expired = deadline <= refusal.t;
        let granted = self.grants.get(&key).copied().unwrap_or(0);
        if signalled || expired || self.freed_early(refusal.worker, granted, refusal.t) {
            return None;
        }
        let step = match refusal.event {
            Event::Read { .. } => "claim",
            _ => "write",
        };
        Some(Violation {
            rule: 3,
            summary: format!(
                "unexplained refusal: the {step} of worker {} lease {lease} (token {token}, row {row:?}) was refused {:.1} ms before its local deadline, with no lost signal and no fault that frees locks early",
                refusal.worker,
                (deadline - refusal.t) as f64 / 1e6
            ),
            excerpt: self.excerpt_around(&[key], refusal.t),
        })
    }

    /// Whether a fault that the store documents as freeing locks early hit `worker`'s lease
    /// granted at `granted`, before `t`. A fault hits the leases granted before it ended (a
    /// lease granted while a restart or a terminate was under way may be among those it freed)
    /// and explains what happens after it began.
    fn freed_early(&self, worker: u32, granted: u64, t: u64) -> bool {
        self.history.iter().any(|e| match &e.event {
            Event::Fault {
                id,
                frees_early: true,
                target,
                ..
            } => {
                let ended = self.healed.get(id).copied().unwrap_or(e.t);
                target.is_none_or(|w| w == worker) && granted <= ended && e.t <= t
            }
            _ => false,
        })
    }

    /// Rule 1 across modes: a lease asked for after another lease's grant was received has a
    /// greater token (the contract: every lease of a key, in any mode, has a token greater
    /// than every earlier one).
    fn tokens_not_growing(&self) -> Vec<Violation> {
        let mut violations = Vec::new();
        // The greatest token granted so far, and whose it was.
        let mut highest: Option<(u64, u32, u64)> = None;
        let mut before_ask: HashMap<(u32, u64), (u64, u32, u64)> = HashMap::new();
        for e in self.history {
            match &e.event {
                Event::Acquire { lease, .. } => {
                    if let Some(h) = highest {
                        before_ask.insert((e.worker, *lease), h);
                    }
                }
                Event::Grant { lease, token, .. } => {
                    if let Some(&(prev, w, l)) = before_ask.get(&(e.worker, *lease)) {
                        if *token <= prev {
                            violations.push(Violation {
                                rule: 1,
                                summary: format!(
                                    "token not greater than an earlier one: worker {} lease {lease} was granted token {token}, asked for after worker {w} lease {l} was granted token {prev}",
                                    e.worker
                                ),
                                excerpt: self.excerpt(&[(w, l), (e.worker, *lease)]),
                            });
                        }
                    }
                    if highest.is_none_or(|(h, _, _)| *token > h) {
                        highest = Some((*token, e.worker, *lease));
                    }
                }
                _ => {}
            }
        }
        violations
    }

    /// Each lease's hold by the contract: from its grant until its last known local
    /// deadline, its release's sending, its lost signal or its worker's kill.
    fn holds(&self) -> Vec<Held> {
        let mut holds: Vec<Held> = Vec::new();
        let mut at: HashMap<(u32, u64), usize> = HashMap::new();
        for e in self.history {
            let Some(lease) = e.event.lease() else {
                continue;
            };
            let key = (e.worker, lease);
            match &e.event {
                Event::Grant {
                    token,
                    deadline,
                    mode,
                    slot,
                    ..
                } => {
                    let until = self
                        .killed
                        .get(&e.worker)
                        .map_or(*deadline, |&k| (*deadline).min(k));
                    at.insert(key, holds.len());
                    holds.push(Held {
                        worker: e.worker,
                        lease,
                        mode: *mode,
                        slot: *slot,
                        token: *token,
                        granted: e.t,
                        until,
                    });
                }
                // An extend confirmed before this step moved the deadline on.
                Event::Read { deadline, .. } | Event::Write { deadline, .. } => {
                    if let Some(h) = at.get(&key).map(|&i| &mut holds[i]) {
                        let cap = self.killed.get(&e.worker).copied().unwrap_or(u64::MAX);
                        h.until = h.until.max((*deadline).min(cap));
                    }
                }
                _ => {}
            }
        }
        for e in self.history {
            let Some(lease) = e.event.lease() else {
                continue;
            };
            let Some(h) = at.get(&(e.worker, lease)).map(|&i| &mut holds[i]) else {
                continue;
            };
            match &e.event {
                Event::Lost { .. } => h.until = h.until.min(e.t),
                Event::Release { sent, .. } if *sent > 0 => h.until = h.until.min(*sent),
                _ => {}
            }
        }
        holds
    }

    /// Rule 3 from the grants alone: a lease granted while a conflicting one was held by the
    /// contract, a permit beyond the limit, two permits in one slot, or a slot out of range.
    fn conflicting_grants(&self) -> Vec<Violation> {
        let mut holds = self.holds();
        holds.sort_by_key(|h| h.granted);
        let mut violations = Vec::new();
        for (i, later) in holds.iter().enumerate() {
            if later.until <= later.granted {
                // Its answer came after its deadline (a worker frozen in between): it never
                // held the key by the contract after its grant was seen.
                continue;
            }
            if let WorkMode::Permit { limit } = later.mode {
                if later.slot.is_none_or(|s| s >= limit) {
                    violations.push(Violation {
                        rule: 3,
                        summary: format!(
                            "permit of {limit} granted with slot {:?}: worker {} lease {} (token {})",
                            later.slot, later.worker, later.lease, later.token
                        ),
                        excerpt: self.excerpt(&[(later.worker, later.lease)]),
                    });
                }
            }
            // The earlier leases still held at this grant, and not freed early before it.
            let held: Vec<&Held> = holds[..i]
                .iter()
                .filter(|h| h.until > later.granted)
                .filter(|h| !self.freed_early(h.worker, h.granted, later.granted))
                .collect();
            let why = held.iter().find_map(|h| {
                if !later.mode.compatible_with(h.mode) {
                    Some((
                        h,
                        format!("{} next to {}", later.mode.name(), h.mode.name()),
                    ))
                } else if later.slot.is_some() && later.slot == h.slot {
                    Some((h, format!("two permits in slot {}", h.slot.unwrap_or(0))))
                } else {
                    match later.mode {
                        WorkMode::Permit { limit } if held.len() as u64 >= u64::from(limit) => {
                            Some((
                                h,
                                format!("{} permits of {limit} held at once", held.len() + 1),
                            ))
                        }
                        _ => None,
                    }
                }
            });
            if let Some((h, what)) = why {
                violations.push(Violation {
                    rule: 3,
                    summary: format!(
                        "conflicting grant ({what}): worker {} lease {} (token {}) was granted {:.1} ms before worker {} lease {} (token {}) stopped holding by the contract",
                        later.worker, later.lease, later.token,
                        (h.until - later.granted) as f64 / 1e6,
                        h.worker, h.lease, h.token
                    ),
                    excerpt: self.excerpt_around(
                        &[(h.worker, h.lease), (later.worker, later.lease)],
                        later.granted,
                    ),
                });
            }
        }
        violations
    }

    /// Rule 4's measure for every stretch of every wait in which the waiter could be served
    /// (not paused or cut off, not killed, no unavailability fault in progress, before the
    /// stop).
    fn unserved_waits(&self, delays: &StoreDelays) -> Vec<UnservedWait> {
        let gaps = self.serve_gaps(delays);
        let pieces = self.servable_pieces(&gaps);
        // While someone could be served, the clock restarts at every restart, and at the start
        // of each such stretch (before it, no one asked).
        let mut measured = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let (p, mut q) = (pieces[i].0, pieces[i].1);
            let mut j = i + 1;
            while j < pieces.len() && pieces[j].0 <= q {
                q = q.max(pieces[j].1);
                j += 1;
            }
            let stretch = &pieces[i..j];
            i = j;
            measured.extend(longest_unserved(&gaps.restarts, stretch, p, q));
        }
        measured
    }

    /// Rule 4's clock restarts and the spans in which no one, or one worker, can be served,
    /// from the history's faults (and its grants and start, for the restarts).
    fn serve_gaps(&self, delays: &StoreDelays) -> ServeGaps {
        // The clock's restarts: every grant, every client fault's start, every end of a fault
        // during which the store is documented as unavailable.
        let mut restarts: Vec<u64> = self.grant_times.clone();
        // Spans in which no one can be served, and spans in which one worker cannot.
        let mut unavailable: Vec<(u64, u64)> = Vec::new();
        let mut silenced: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for e in self.history {
            let Event::Fault {
                id, kind, target, ..
            } = &e.event
            else {
                continue;
            };
            let Some(fault) = Fault::parse(kind) else {
                continue;
            };
            let ended = self.healed.get(id).copied().unwrap_or(u64::MAX);
            if fault.is_client() {
                restarts.push(e.t);
            }
            if delays.unavailable_during(fault) {
                unavailable.push((e.t, ended));
                if ended != u64::MAX {
                    restarts.push(ended);
                }
            }
            if let (true, Some(w)) = (fault.silences_target(), target) {
                silenced.entry(*w).or_default().push((e.t, ended));
            }
        }
        if let Some(first) = self.history.first() {
            restarts.push(first.t);
        }
        restarts.sort_unstable();
        ServeGaps {
            restarts,
            unavailable,
            silenced,
        }
    }

    /// Each worker's want of the key: from its acquire to its grant (a failed wait and the
    /// next ask are one want), its kill or the end; then the stretches in which it could be
    /// served, outside `gaps`, ordered by their start (then worker).
    fn servable_pieces(&self, gaps: &ServeGaps) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = Vec::new();
        let mut open: HashMap<u32, (u64, WorkMode, u64)> = HashMap::new();
        let mut close = |worker: u32, (lease, mode, from): (u64, WorkMode, u64), to: u64| {
            let mut spans = gaps.unavailable.clone();
            spans.extend(gaps.silenced.get(&worker).into_iter().flatten().copied());
            for (p, q) in subtract(from, to.min(self.end), &mut spans) {
                pieces.push((p, q, worker, lease, mode));
            }
        };
        for e in self.history {
            match &e.event {
                Event::Acquire { lease, mode } => {
                    open.entry(e.worker).or_insert((*lease, *mode, e.t));
                }
                Event::Grant { .. } => {
                    if let Some(want) = open.remove(&e.worker) {
                        close(e.worker, want, e.t);
                    }
                }
                _ => {}
            }
        }
        for (worker, want) in open {
            let to = self.killed.get(&worker).copied().unwrap_or(u64::MAX);
            close(worker, want, to);
        }
        pieces.sort_by_key(|p| (p.0, p.2));
        pieces
    }

    /// Rule 5: the observer's terms never go back, and every leadership that led for twice
    /// the observer's bound, outside store faults, is seen within it.
    fn observer_behind(&self, ttl_ms: u64) -> Vec<Violation> {
        let bound = crate::clock::nanos(observer_bound(ttl_ms));
        let observer = crate::worker::OBSERVER;
        let Some(started) = self
            .history
            .iter()
            .find(|e| e.worker == observer && matches!(e.event, Event::Start { .. }))
            .map(|e| e.t)
        else {
            return Vec::new();
        };
        let seen: Vec<(u64, u64)> = self
            .history
            .iter()
            .filter(|e| e.worker == observer)
            .filter_map(|e| match e.event {
                // Term 0 is a holder whose term the store cannot tell yet (MySQL between a
                // grant and its fence bump): it orders nothing.
                Event::Observed { term: Some(term) } if term > 0 => Some((e.t, term)),
                _ => None,
            })
            .collect();
        let mut violations = Vec::new();
        if let Some(pair) = seen.windows(2).find(|pair| pair[1].1 < pair[0].1) {
            violations.push(Violation {
                rule: 5,
                summary: format!(
                    "observer behind: it yielded term {} after term {}",
                    pair[1].1, pair[0].1
                ),
                excerpt: self.excerpt_span(pair[0].0, pair[1].0, observer),
            });
        }
        // Store faults, as (start, end) with no end a fault never healed.
        let store_faults: Vec<(u64, u64)> = self
            .history
            .iter()
            .filter_map(|e| match &e.event {
                Event::Fault {
                    id, target: None, ..
                } => Some((e.t, self.healed.get(id).copied().unwrap_or(u64::MAX))),
                _ => None,
            })
            .collect();
        for entry in self.history {
            let Event::Grant {
                lease,
                token,
                leader: true,
                ..
            } = entry.event
            else {
                continue;
            };
            let granted = entry.t;
            let key = (entry.worker, lease);
            let released = self.history.iter().find_map(|e| match e.event {
                Event::Release { lease: l, sent, .. } if e.worker == entry.worker && l == lease => {
                    Some(sent.max(granted))
                }
                _ => None,
            });
            let ended = [
                released,
                self.lost_at.get(&key).copied(),
                self.killed
                    .get(&entry.worker)
                    .copied()
                    .filter(|&k| k >= granted),
                Some(self.end),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.end);
            let (from, to) = (granted.saturating_sub(bound), granted + bound);
            let faulted = store_faults.iter().any(|&(s, e)| s <= to && e >= from);
            if ended.saturating_sub(granted) < 2 * bound || from < started + bound || faulted {
                continue;
            }
            if !seen
                .iter()
                .any(|&(t, term)| term == token && t >= from && t <= to)
            {
                violations.push(Violation {
                    rule: 5,
                    summary: format!(
                        "observer behind: worker {} led in term {token} for {:.0} ms from its grant, and the observer did not yield that term within {:.0} ms of it",
                        entry.worker,
                        ended.saturating_sub(granted) as f64 / 1e6,
                        bound as f64 / 1e6
                    ),
                    excerpt: self.excerpt_span(from, to, entry.worker),
                });
            }
        }
        violations
    }

    /// Rule 6: on a store whose queue is fair, a waiter is granted before every request asked
    /// [`QUEUE_SETTLE`] or more after it in a mode the queue orders after its own, while it is
    /// not paused, cut off or killed and no store fault is in progress.
    fn passed_waiters(&self, delays: &StoreDelays) -> Vec<Violation> {
        if delays.order == crate::delays::Order::Unordered {
            return Vec::new();
        }
        let settle = crate::clock::nanos(QUEUE_SETTLE);
        // Each want: (worker, lease, mode, asked, ended, granted).
        let mut wants: Vec<(u32, u64, WorkMode, u64, u64, bool)> = Vec::new();
        let mut open: HashMap<(u32, u64), (WorkMode, u64)> = HashMap::new();
        // Spans in which the queue's order is not promised: store faults for everyone, and a
        // worker's own pauses and cuts.
        let mut store_faults: Vec<(u64, u64)> = Vec::new();
        let mut silenced: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        for e in self.history {
            match &e.event {
                Event::Acquire { lease, mode } => {
                    open.insert((e.worker, *lease), (*mode, e.t));
                }
                Event::Grant { lease, .. } | Event::AcquireFailed { lease, .. } => {
                    if let Some((mode, asked)) = open.remove(&(e.worker, *lease)) {
                        let granted = matches!(e.event, Event::Grant { .. });
                        wants.push((e.worker, *lease, mode, asked, e.t, granted));
                    }
                }
                Event::Fault {
                    id, kind, target, ..
                } => {
                    let Some(fault) = Fault::parse(kind) else {
                        continue;
                    };
                    let ended = self.healed.get(id).copied().unwrap_or(u64::MAX);
                    match target {
                        None => store_faults.push((e.t, ended)),
                        Some(w) if fault.silences_target() => {
                            silenced.entry(*w).or_default().push((e.t, ended))
                        }
                        Some(_) => {}
                    }
                }
                _ => {}
            }
        }
        for ((worker, lease), (mode, asked)) in open {
            let ended = self.killed.get(&worker).copied().unwrap_or(self.end);
            wants.push((worker, lease, mode, asked, ended, false));
        }
        let overlaps = |spans: &[(u64, u64)], from: u64, to: u64| {
            spans.iter().any(|&(p, q)| p <= to && q >= from)
        };
        let start = self.history.first().map_or(0, |e| e.t);
        let mut violations = Vec::new();
        for &(worker, lease, mode, asked, ended, granted) in &wants {
            // A worker's first request also sets up what its handle does once (a session, a
            // key's parent nodes), for longer than the settle: ordered from its second on.
            if lease == 1 {
                continue;
            }
            let killed = self.killed.get(&worker).copied().unwrap_or(u64::MAX);
            let own = silenced.get(&worker).map_or(&[][..], Vec::as_slice);
            // The first request that passed this waiter, if any: granted first, and not let in
            // next to it (two permits a free slot each granted in one release's wake-up are
            // served together, whichever answer arrived first).
            let passed = wants
                .iter()
                .filter(|v| v.0 != worker && v.5 && v.3 >= asked + settle)
                .filter(|v| v.4 < ended && v.4 < killed && v.4 <= self.end)
                .filter(|v| {
                    let held_until = self.released.get(&(v.0, v.1)).copied().unwrap_or(u64::MAX);
                    ended > held_until || !granted
                })
                .filter(|v| delays.order.orders(mode, v.2))
                .filter(|v| !overlaps(&store_faults, asked, v.4) && !overlaps(own, asked, v.4))
                .min_by_key(|v| v.4);
            let Some(&(by, by_lease, by_mode, by_asked, by_granted, _)) = passed else {
                continue;
            };
            violations.push(Violation {
                rule: 6,
                summary: format!(
                    "a waiter passed: worker {worker} ({}, lease {lease}) asked at {:.3} s and \
                     was still waiting when worker {by} ({}, lease {by_lease}), which asked \
                     {:.3} s after it, was granted at {:.3} s; the store's queue is fair",
                    mode.name(),
                    secs(asked.saturating_sub(start)),
                    by_mode.name(),
                    secs(by_asked.saturating_sub(asked)),
                    secs(by_granted.saturating_sub(start)),
                ),
                excerpt: self.excerpt_span(asked, by_granted, worker),
            });
        }
        violations
    }

    /// Rule 4's violation for a wait longer than the bound.
    fn unavailability(
        &self,
        wait: &UnservedWait,
        in_ttls: impl Fn(u64) -> f64,
        bound: Duration,
    ) -> Violation {
        let from = match self.history.iter().find(|e| e.t == wait.since) {
            Some(Entry {
                event: Event::Grant { .. },
                worker,
                ..
            }) => format!("the grant to worker {worker}"),
            Some(Entry {
                event: Event::Fault { id, kind, .. },
                ..
            }) => format!("the start of fault {id} ({kind})"),
            Some(Entry {
                event: Event::Healed { id },
                ..
            }) => format!("the end of fault {id}"),
            Some(Entry {
                event: Event::Acquire { .. },
                worker,
                ..
            }) => format!("worker {worker}'s ask, when no one else could be served"),
            _ => "the start of the history".to_string(),
        };
        // From the last fault before the clock started, which is often the cause.
        let from_fault = self
            .history
            .iter()
            .rev()
            .filter(|e| e.t <= wait.since && matches!(e.event, Event::Fault { .. }))
            .map(|e| e.t)
            .next()
            .unwrap_or(wait.since);
        Violation {
            rule: 4,
            summary: format!(
                "unavailability: worker {} ({}, lease {}) waited, not paused, {:.2} TTLs with no grant to anyone, counted from {from}; the bound is {:.2} TTLs (two TTLs and the store's delays)",
                wait.worker,
                wait.mode.name(),
                wait.lease,
                in_ttls(wait.longest),
                in_ttls(crate::clock::nanos(bound)),
            ),
            excerpt: self.excerpt_span(from_fault, wait.at, wait.worker),
        }
    }

    /// The faults, acquires, grants and releases in `[from, to]`, and everything `worker` did.
    fn excerpt_span(&self, from: u64, to: u64, worker: u32) -> Vec<String> {
        let lines: Vec<String> = self
            .history
            .iter()
            .filter(|e| e.t >= from && e.t <= to)
            .filter(|e| {
                e.worker == worker
                    || matches!(
                        e.event,
                        Event::Fault { .. }
                            | Event::Healed { .. }
                            | Event::Grant { .. }
                            | Event::Acquire { .. }
                            | Event::Release { .. }
                    )
            })
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect();
        shorten(lines)
    }

    /// Every entry of the given leases, the faults meanwhile, and the grants of other leases
    /// in that span (who took over), as JSON lines.
    fn excerpt(&self, leases: &[(u32, u64)]) -> Vec<String> {
        let end = self
            .history
            .iter()
            .filter(|e| {
                e.event
                    .lease()
                    .is_some_and(|l| leases.contains(&(e.worker, l)))
            })
            .map(|e| e.t)
            .max()
            .unwrap_or(0);
        self.excerpt_around(leases, end)
    }

    fn excerpt_around(&self, leases: &[(u32, u64)], end: u64) -> Vec<String> {
        let ours = |e: &Entry| {
            e.event
                .lease()
                .is_some_and(|l| leases.contains(&(e.worker, l)))
        };
        let start = self
            .history
            .iter()
            .filter(|e| ours(e))
            .map(|e| e.t)
            .min()
            .unwrap_or(end);
        let lines: Vec<String> = self
            .history
            .iter()
            .filter(|e| e.t >= start && e.t <= end)
            .filter(|e| {
                ours(e)
                    || matches!(
                        e.event,
                        Event::Fault { .. } | Event::Healed { .. } | Event::Grant { .. }
                    )
            })
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect();
        shorten(lines)
    }

    /// Overlapping critical sections of conflicting modes (grant to the lease's last answer
    /// from the resource), counted once per later section, attributed to that section's
    /// window and mode.
    fn overlaps(&self) -> Vec<(&'h str, WorkMode, u64)> {
        let mut sections: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
        for e in self.history {
            let Some(lease) = e.event.lease() else {
                continue;
            };
            let key = (e.worker, lease);
            match e.event {
                Event::Grant { .. } => {
                    sections.insert(key, (e.t, e.t));
                }
                // The section ends with the last answer from the resource; the release's own
                // answer may come after the next holder's grant, which is no overlap.
                Event::Read { .. } | Event::Write { .. } => {
                    if let Some(section) = sections.get_mut(&key) {
                        section.1 = section.1.max(e.t);
                    }
                }
                _ => {}
            }
        }
        let mut sorted: Vec<(u64, u64, WorkMode)> = sections
            .into_iter()
            .map(|(key, (start, end))| {
                (
                    start,
                    end,
                    self.modes.get(&key).copied().unwrap_or_default(),
                )
            })
            .collect();
        sorted.sort_unstable();
        let mut counts: HashMap<(&'h str, WorkMode), u64> = HashMap::new();
        for (i, &(start, _, mode)) in sorted.iter().enumerate() {
            // Permits next to permits and readers next to readers are the point of the modes.
            let overlapped = sorted[..i]
                .iter()
                .any(|&(_, end, other)| end > start && !mode.compatible_with(other));
            if overlapped {
                *counts.entry((self.window(start), mode)).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .map(|((window, mode), n)| (window, mode, n))
            .collect()
    }
}

/// What rule 4 measures waits against ([`Index::serve_gaps`]).
struct ServeGaps {
    /// The instants the clock restarts at, in order.
    restarts: Vec<u64>,
    /// Spans in which no one can be served.
    unavailable: Vec<(u64, u64)>,
    /// Spans in which one worker cannot be served, by worker.
    silenced: HashMap<u32, Vec<(u64, u64)>>,
}

/// One stretch of a worker's want in which it could be served: (from, to, worker, lease,
/// mode).
type Piece = (u64, u64, u32, u64, WorkMode);

/// Rule 4's measure of one stretch `(p, q]` in which someone could be served (the `stretch`
/// of pieces that make it up): the longest time with no grant, the clock restarting at each
/// of `restarts` and at `p`, and who waited it.
fn longest_unserved(restarts: &[u64], stretch: &[Piece], p: u64, q: u64) -> Option<UnservedWait> {
    // The time since the clock's last restart grows between restarts: its largest
    // values are just before each restart inside (p, q], and at q.
    let last_before = |t: u64, strictly: bool| {
        let k = restarts.partition_point(|&r| if strictly { r < t } else { r <= t });
        restarts[..k].last().copied().unwrap_or(p).max(p)
    };
    let first = restarts.partition_point(|&r| r <= p);
    let mut candidates: Vec<(u64, u64)> = restarts[first..]
        .iter()
        .take_while(|&&r| r <= q)
        .map(|&r| (last_before(r, true), r))
        .collect();
    candidates.push((last_before(q, false), q));
    let &(since, at) = candidates.iter().max_by_key(|(s, t)| t - s)?;
    // Whoever could be served just before that moment, longest wanting first.
    let waiter = stretch
        .iter()
        .filter(|w| w.0 < at && w.1 >= at)
        .min_by_key(|w| w.0)
        .unwrap_or(&stretch[0]);
    Some(UnservedWait {
        worker: waiter.2,
        lease: waiter.3,
        mode: waiter.4,
        longest: at - since,
        since,
        at,
    })
}

/// `[from, to]` without the given spans, as the stretches left.
fn subtract(from: u64, to: u64, gaps: &mut [(u64, u64)]) -> Vec<(u64, u64)> {
    gaps.sort_unstable();
    let mut left = Vec::new();
    let mut at = from;
    for &(a, b) in gaps.iter() {
        if b <= at || a >= to {
            continue;
        }
        if a > at {
            left.push((at, a));
        }
        at = at.max(b);
    }
    if at < to {
        left.push((at, to));
    }
    left
}

/// At most 40 lines: the start and the end, where the leases begin and the violation is.
fn shorten(lines: Vec<String>) -> Vec<String> {
    const MAX_LINES: usize = 40;
    if lines.len() <= MAX_LINES {
        return lines;
    }
    let mut kept = lines[..MAX_LINES / 2].to_vec();
    kept.push(format!(
        "... {} entries left out ...",
        lines.len() - MAX_LINES
    ));
    kept.extend_from_slice(&lines[lines.len() - MAX_LINES / 2..]);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TTL_MS: u64 = 1000;
    /// A store without delays: rule 4's bound is two TTLs.
    const PLAIN: &StoreDelays = &crate::delays::NONE;

    fn at(t_ms: u64, worker: u32, event: Event) -> Entry {
        Entry {
            t: t_ms * MS,
            worker,
            event,
        }
    }

    fn grant(t_ms: u64, worker: u32, lease: u64, token: u64) -> Entry {
        at(
            t_ms,
            worker,
            Event::Grant {
                lease,
                token,
                ttl_ms: TTL_MS,
                deadline: (t_ms + TTL_MS) * MS,
                mode: WorkMode::Exclusive,
                slot: None,
                leader: false,
            },
        )
    }

    /// A grant in `mode` (a permit in `slot`).
    fn grant_as(
        t_ms: u64,
        worker: u32,
        lease: u64,
        token: u64,
        mode: WorkMode,
        slot: Option<u32>,
    ) -> Entry {
        let mut entry = grant(t_ms, worker, lease, token);
        if let Event::Grant {
            mode: m, slot: s, ..
        } = &mut entry.event
        {
            (*m, *s) = (mode, slot);
        }
        entry
    }

    fn acquire(t_ms: u64, worker: u32, lease: u64) -> Entry {
        at(
            t_ms,
            worker,
            Event::Acquire {
                lease,
                mode: WorkMode::Exclusive,
            },
        )
    }

    fn release(t_ms: u64, worker: u32, lease: u64, token: u64) -> Entry {
        at(
            t_ms,
            worker,
            Event::Release {
                lease,
                token,
                outcome: "released".into(),
                sent: t_ms * MS,
            },
        )
    }

    fn fault(t_ms: u64, id: u32, kind: &str, target: Option<u32>) -> Entry {
        at(
            t_ms,
            0,
            Event::Fault {
                id,
                kind: kind.into(),
                target,
                frees_early: false,
                detail: String::new(),
            },
        )
    }

    fn healed(t_ms: u64, id: u32) -> Entry {
        at(t_ms, 0, Event::Healed { id })
    }

    fn read(t_ms: u64, worker: u32, lease: u64, token: u64, value: Option<i64>) -> Entry {
        at(
            t_ms,
            worker,
            Event::Read {
                lease,
                token,
                row: Row::Fenced,
                value,
                deadline: (t_ms + 900) * MS,
                lost: false,
            },
        )
    }

    fn write(t_ms: u64, worker: u32, lease: u64, token: u64, log_id: Option<i64>) -> Entry {
        at(
            t_ms,
            worker,
            Event::Write {
                lease,
                token,
                row: Row::Fenced,
                log_id,
                deadline: (t_ms + 900) * MS,
                lost: false,
            },
        )
    }

    fn accepted(id: i64, token: u64, worker: u32, lease: u64, read_value: i64) -> Accepted {
        Accepted {
            id,
            row: Row::Fenced,
            token,
            worker,
            lease,
            read_value,
            new_value: read_value + 1,
        }
    }

    /// Two holders one after the other, each claiming, writing and releasing.
    fn clean_history() -> (Vec<Entry>, ResourceState) {
        let history = vec![
            grant(0, 1, 1, 10),
            read(1, 1, 1, 10, Some(0)),
            write(2, 1, 1, 10, Some(1)),
            release(2, 1, 1, 10),
            grant(3, 2, 1, 11),
            read(4, 2, 1, 11, Some(1)),
            write(5, 2, 1, 11, Some(2)),
            release(5, 2, 1, 11),
        ];
        let resource = ResourceState {
            fenced: 2,
            accepted: vec![accepted(1, 10, 1, 1, 0), accepted(2, 11, 2, 1, 1)],
            ..ResourceState::default()
        };
        (history, resource)
    }

    /// Worker 1 holds a permit of 2; worker 2 asks to write at 100 ms (its second lease: a
    /// worker's first is not ordered); worker 3 asks for a permit at 500 ms and is granted at
    /// 600 ms, before the writer, which is granted at 1300 ms once both permits are gone.
    fn a_permit_passes_a_writer(store: &StoreDelays, pause_writer: bool) -> Verdict {
        let permits = WorkMode::Permit { limit: 2 };
        let mut history = vec![
            at(
                0,
                1,
                Event::Acquire {
                    lease: 1,
                    mode: permits,
                },
            ),
            grant_as(10, 1, 1, 1, permits, Some(0)),
            acquire(100, 2, 2),
            at(
                500,
                3,
                Event::Acquire {
                    lease: 1,
                    mode: permits,
                },
            ),
            grant_as(600, 3, 1, 2, permits, Some(1)),
            release(1000, 1, 1, 1),
            release(1200, 3, 1, 2),
            grant(1300, 2, 2, 3),
            release(1400, 2, 2, 3),
        ];
        if pause_writer {
            history.insert(3, fault(150, 1, "pause-waiter", Some(2)));
            history.insert(6, at(700, 0, Event::Healed { id: 1 }));
        }
        check(&history, &ResourceState::default(), TTL_MS, store)
    }

    #[test]
    fn a_waiter_passed_on_a_fair_store_breaks_rule_6() {
        let fair = StoreDelays {
            order: crate::delays::Order::Fair,
            ..crate::delays::NONE
        };
        let verdict = a_permit_passes_a_writer(&fair, false);
        assert!(verdict.broke(6), "{:#?}", verdict.violations);
        let v = verdict.violations.iter().find(|v| v.rule == 6).unwrap();
        assert!(v.summary.contains("worker 2 (exclusive"), "{}", v.summary);
        assert!(v.summary.contains("worker 3 (permit of 2"), "{}", v.summary);
        // PostgreSQL orders every pair with a writer in it: the same.
        let writers = StoreDelays {
            order: crate::delays::Order::WritersOrdered,
            ..crate::delays::NONE
        };
        assert!(a_permit_passes_a_writer(&writers, false).broke(6));
    }

    /// Worker 1 writes; worker 2 asks for a permit of 2 at 100 ms (its second lease), worker
    /// 3 for one at 500 ms. The writer's release lets both in: worker 3's answer arrives
    /// first, worker 2's `second_ms` later.
    fn two_permits_after_a_writer(second_ms: u64) -> Verdict {
        let permits = WorkMode::Permit { limit: 2 };
        let fair = StoreDelays {
            order: crate::delays::Order::Fair,
            ..crate::delays::NONE
        };
        let mut history = vec![
            acquire(0, 1, 1),
            grant(10, 1, 1, 1),
            at(
                100,
                2,
                Event::Acquire {
                    lease: 2,
                    mode: permits,
                },
            ),
            at(
                500,
                3,
                Event::Acquire {
                    lease: 1,
                    mode: permits,
                },
            ),
            release(900, 1, 1, 1),
            grant_as(901, 3, 1, 2, permits, Some(0)),
            release(950, 3, 1, 2),
            grant_as(901 + second_ms, 2, 2, 3, permits, Some(1)),
            release(1000 + second_ms, 2, 2, 3),
        ];
        history.sort_by_key(|e| e.t);
        check(&history, &ResourceState::default(), TTL_MS, &fair)
    }

    #[test]
    fn two_permits_let_in_together_pass_no_one_but_a_permit_let_in_after_the_later_one_left_was_passed(
    ) {
        let together = two_permits_after_a_writer(2);
        assert!(!together.broke(6), "{:#?}", together.violations);
        let after = two_permits_after_a_writer(100);
        assert!(after.broke(6), "{:#?}", after.violations);
    }

    #[test]
    fn rule_6_asks_nothing_of_an_unordered_store_or_of_a_paused_waiter() {
        let unordered = a_permit_passes_a_writer(PLAIN, false);
        assert!(!unordered.broke(6), "{:#?}", unordered.violations);
        let fair = StoreDelays {
            order: crate::delays::Order::Fair,
            ..crate::delays::NONE
        };
        let paused = a_permit_passes_a_writer(&fair, true);
        assert!(!paused.broke(6), "{:#?}", paused.violations);
    }

    #[test]
    fn readers_join_readers_and_postgres_leaves_readers_and_permits_unordered() {
        use crate::delays::Order;
        assert!(!Order::Fair.orders(WorkMode::Shared, WorkMode::Shared));
        assert!(Order::Fair.orders(WorkMode::Shared, WorkMode::Permit { limit: 2 }));
        assert!(Order::Fair.orders(WorkMode::Permit { limit: 2 }, WorkMode::Permit { limit: 2 }));
        assert!(!Order::WritersOrdered.orders(WorkMode::Shared, WorkMode::Permit { limit: 2 }));
        assert!(Order::WritersOrdered.orders(WorkMode::Shared, WorkMode::Exclusive));
        assert!(!Order::Unordered.orders(WorkMode::Exclusive, WorkMode::Exclusive));
    }

    #[test]
    fn a_clean_history_passes() {
        let (history, resource) = clean_history();
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        assert_eq!(verdict.total().writes_accepted, 2);
        assert_eq!(verdict.total().acquisitions, 2);
    }

    #[test]
    fn a_stale_write_accepted_breaks_rule_1() {
        let (mut history, mut resource) = clean_history();
        // Worker 1 writes again with its old token after worker 2, and the resource takes it.
        history.push(write(6, 1, 1, 10, Some(3)));
        resource.accepted.push(accepted(3, 10, 1, 1, 2));
        resource.fenced = 3;
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.broke(1), "{:#?}", verdict.violations);
        assert!(!verdict.broke(2) && !verdict.broke(3));
        assert_eq!(verdict.total().stale_accepted, 1);
        let v = &verdict.violations[0];
        assert!(v.summary.contains("token 10"), "{}", v.summary);
        assert!(!v.excerpt.is_empty());
    }

    #[test]
    fn a_counter_short_of_its_accepted_writes_breaks_rule_2() {
        let (history, mut resource) = clean_history();
        resource.fenced = 1;
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.broke(2), "{:#?}", verdict.violations);
        assert!(!verdict.broke(1) && !verdict.broke(3));
    }

    #[test]
    fn a_write_computed_from_an_overwritten_read_breaks_rule_2() {
        let (history, mut resource) = clean_history();
        // Both writes read 0: the second overwrote the first's increment.
        resource.accepted[1].read_value = 0;
        resource.accepted[1].new_value = 1;
        resource.fenced = 1;
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.broke(2), "{:#?}", verdict.violations);
        assert!(verdict
            .violations
            .iter()
            .any(|v| v.summary.contains("read 0")));
    }

    #[test]
    fn a_refusal_while_the_holder_still_held_the_lock_breaks_rule_3() {
        let (mut history, resource) = clean_history();
        // Worker 3 is granted a lease (token 5, below the row's 11) and its claim is refused
        // 1 ms later: no lost signal, deadline far ahead, no fault.
        history.push(grant(10, 3, 1, 5));
        history.push(read(11, 3, 1, 5, None));
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.broke(3), "{:#?}", verdict.violations);
        assert!(!verdict.broke(1) && !verdict.broke(2));
        assert_eq!(verdict.total().stale_refused, 1);
    }

    #[test]
    fn a_refusal_after_the_lost_signal_is_explained() {
        let (mut history, resource) = clean_history();
        history.insert(
            3,
            at(
                2,
                1,
                Event::Lost {
                    lease: 1,
                    token: 10,
                    reason: "test".into(),
                },
            ),
        );
        history.push(write(6, 1, 1, 10, None));
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        assert_eq!(verdict.total().lost_signals, 1);
    }

    #[test]
    fn a_refusal_after_the_local_deadline_is_explained() {
        let (mut history, resource) = clean_history();
        let mut late = write(2000, 1, 1, 10, None);
        if let Event::Write { deadline, .. } = &mut late.event {
            *deadline = 1000 * MS;
        }
        history.push(late);
        assert!(check(&history, &resource, TTL_MS, PLAIN).is_safe());
    }

    #[test]
    fn a_refusal_after_a_fault_that_frees_locks_early_is_explained_only_for_leases_it_hit() {
        let fault = |frees_early| {
            at(
                7,
                0,
                Event::Fault {
                    id: 1,
                    kind: "redis-restart".into(),
                    target: None,
                    frees_early,
                    detail: String::new(),
                },
            )
        };
        let (mut history, resource) = clean_history();
        history.push(fault(true));
        history.push(write(8, 2, 1, 11, None));
        assert!(check(&history, &resource, TTL_MS, PLAIN).is_safe());

        let (mut history, resource) = clean_history();
        history.push(fault(false));
        history.push(write(8, 2, 1, 11, None));
        assert!(check(&history, &resource, TTL_MS, PLAIN).broke(3));

        // A lease granted while the fault was under way is hit by it.
        let (mut history, resource) = clean_history();
        history.push(fault(true));
        history.push(grant(8, 3, 1, 12));
        history.push(at(9, 0, Event::Healed { id: 1 }));
        history.push(write(10, 3, 1, 12, None));
        assert!(check(&history, &resource, TTL_MS, PLAIN).is_safe());

        // A lease granted after the fault is not explained by it.
        let (mut history, resource) = clean_history();
        history.push(fault(true));
        history.push(grant(9, 3, 1, 5));
        history.push(read(10, 3, 1, 5, None));
        assert!(check(&history, &resource, TTL_MS, PLAIN).broke(3));
    }

    #[test]
    fn lost_updates_on_the_unchecked_rows_are_counted_not_failed() {
        let (history, mut resource) = clean_history();
        // Two shadow writes both read 0: one increment lost.
        for (id, worker) in [(3, 1), (4, 2)] {
            resource.accepted.push(Accepted {
                row: Row::Shadow,
                ..accepted(id, 10, worker, 1, 0)
            });
        }
        resource.shadow = 1;
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        assert!(verdict.is_safe());
        assert_eq!(verdict.total().lost_shadow, 1);
    }

    #[test]
    fn overlapping_sections_and_unavailability_are_measured() {
        let history = vec![
            grant(0, 1, 1, 10),
            at(
                100,
                0,
                Event::Fault {
                    id: 1,
                    kind: "pause".into(),
                    target: Some(1),
                    frees_early: false,
                    detail: String::new(),
                },
            ),
            grant(1100, 2, 1, 11),
            // The paused holder's write lands after the next holder was granted, and after its
            // deadline.
            {
                let mut late = write(2000, 1, 1, 10, None);
                if let Event::Write { deadline, .. } = &mut late.event {
                    *deadline = 1000 * MS;
                }
                late
            },
            write(2100, 2, 1, 11, Some(1)),
        ];
        let resource = ResourceState {
            fenced: 1,
            accepted: vec![accepted(1, 11, 2, 1, 0)],
            ..ResourceState::default()
        };
        let verdict = check(&history, &resource, TTL_MS, PLAIN);
        let pause = &verdict.by_kind["pause"];
        assert_eq!(pause.overlaps, 1);
        assert_eq!(pause.faults, 1);
        assert!((pause.worst_unavailable_ttl - 1.0).abs() < 1e-9);
    }

    const PERMIT: WorkMode = WorkMode::Permit { limit: 2 };

    #[test]
    fn readers_together_and_permits_up_to_the_limit_pass() {
        let history = vec![
            grant_as(0, 1, 1, 10, WorkMode::Shared, None),
            grant_as(10, 2, 1, 11, WorkMode::Shared, None),
            release(100, 1, 1, 10),
            release(110, 2, 1, 11),
            grant_as(200, 3, 1, 12, PERMIT, Some(0)),
            grant_as(210, 4, 1, 13, PERMIT, Some(1)),
            release(300, 3, 1, 12),
            // Slot 0 is free again: a third permit may take it.
            grant_as(310, 5, 1, 14, PERMIT, Some(0)),
            release(400, 4, 1, 13),
            release(410, 5, 1, 14),
            grant(500, 1, 2, 15),
        ];
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        assert_eq!(verdict.by_mode["shared"].acquisitions, 2);
        assert_eq!(verdict.by_mode["permit of 2"].acquisitions, 3);
        assert_eq!(verdict.total().overlaps, 0);
    }

    #[test]
    fn a_writer_granted_while_a_reader_holds_breaks_rule_3() {
        let history = vec![
            grant_as(0, 1, 1, 10, WorkMode::Shared, None),
            grant(100, 2, 1, 11),
            release(200, 2, 1, 11),
            release(300, 1, 1, 10),
        ];
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(3), "{:#?}", verdict.violations);
        assert!(verdict.violations[0]
            .summary
            .contains("exclusive next to shared"));
        assert!(!verdict.broke(1) && !verdict.broke(2) && !verdict.broke(4));
    }

    #[test]
    fn permits_beyond_the_limit_or_in_one_slot_break_rule_3() {
        let three = vec![
            grant_as(0, 1, 1, 10, PERMIT, Some(0)),
            grant_as(10, 2, 1, 11, PERMIT, Some(1)),
            grant_as(20, 3, 1, 12, PERMIT, Some(1)),
        ];
        let verdict = check(&three, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(3), "{:#?}", verdict.violations);

        let shared_slot = vec![
            grant_as(0, 1, 1, 10, PERMIT, Some(1)),
            grant_as(10, 2, 1, 11, PERMIT, Some(1)),
        ];
        let verdict = check(&shared_slot, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(3), "{:#?}", verdict.violations);
        assert!(verdict.violations[0].summary.contains("slot 1"));

        let out_of_range = vec![grant_as(0, 1, 1, 10, PERMIT, Some(2))];
        let verdict = check(&out_of_range, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(3), "{:#?}", verdict.violations);
    }

    #[test]
    fn a_grant_after_the_holder_stopped_holding_is_no_conflict() {
        // Worker 1's lease ends at its deadline (1000 ms), worker 2's release at its sending,
        // worker 3's at its kill: each next grant comes after.
        let history = vec![
            grant(0, 1, 1, 10),
            grant(1001, 2, 1, 11),
            release(1100, 2, 1, 11),
            grant(1101, 3, 1, 12),
            fault(1200, 1, "kill", Some(3)),
            healed(1201, 1),
            grant(1202, 4, 1, 13),
        ];
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
    }

    #[test]
    fn a_token_not_greater_than_an_earlier_grant_breaks_rule_1() {
        let history = vec![
            grant_as(0, 1, 1, 10, WorkMode::Shared, None),
            at(
                5,
                2,
                Event::Acquire {
                    lease: 1,
                    mode: WorkMode::Shared,
                },
            ),
            grant_as(10, 2, 1, 9, WorkMode::Shared, None),
        ];
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(1), "{:#?}", verdict.violations);
        assert!(!verdict.broke(3));
    }

    #[test]
    fn a_slot_row_keeps_its_own_fence() {
        let slot = |id, token, worker, read_value| Accepted {
            row: Row::Slot(1),
            ..accepted(id, token, worker, 1, read_value)
        };
        let mut resource = ResourceState {
            accepted: vec![slot(1, 10, 1, 0), slot(2, 12, 2, 1)],
            ..ResourceState::default()
        };
        resource.slots.insert(1, 2);
        let verdict = check(&[], &resource, TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        assert_eq!(verdict.total().writes_accepted, 2);

        // A stale permit's write accepted on the slot row after a greater token's.
        resource.accepted.push(slot(3, 11, 3, 2));
        resource.slots.insert(1, 3);
        let verdict = check(&[], &resource, TTL_MS, PLAIN);
        assert!(verdict.broke(1), "{:#?}", verdict.violations);
        assert!(!verdict.broke(2));
    }

    /// Worker 1 holds; worker 2 starts waiting at 50 ms and is paused from 100 ms while it
    /// waits; worker 1 releases at 200 ms; worker 3 waits from 300 ms.
    fn frozen_waiter(next_grant_ms: Option<u64>) -> Vec<Entry> {
        let mut history = vec![
            grant(0, 1, 1, 10),
            acquire(50, 2, 1),
            fault(100, 1, "pause-waiter", Some(2)),
            release(200, 1, 1, 10),
            acquire(300, 3, 1),
        ];
        if let Some(t) = next_grant_ms {
            history.push(grant(t, 3, 1, 11));
        }
        history.push(healed(4000, 1));
        history.push(grant(4010, 2, 1, 12));
        history.push(release(4100, 2, 1, 12));
        if next_grant_ms.is_none() {
            history.push(grant(4110, 3, 1, 13));
        }
        history
    }

    #[test]
    fn a_frozen_waiter_that_keeps_the_key_breaks_rule_4() {
        // The key is free from 200 ms, yet worker 3, asking at 300 ms, is granted only after
        // worker 2 resumed and released: 3.71 TTLs later, past the bound of 2.
        let verdict = check(
            &frozen_waiter(None),
            &ResourceState::default(),
            TTL_MS,
            PLAIN,
        );
        assert!(verdict.broke(4), "{:#?}", verdict.violations);
        assert!(!verdict.broke(1) && !verdict.broke(2) && !verdict.broke(3));
        let v = verdict.violations.iter().find(|v| v.rule == 4).unwrap();
        assert!(v.summary.contains("worker 3"), "{}", v.summary);
        assert!(
            v.excerpt[0].contains("pause-waiter"),
            "the excerpt starts at the fault: {:#?}",
            v.excerpt
        );
        assert!((verdict.total().longest_wait_ttl - 3.71).abs() < 1e-9);
    }

    #[test]
    fn a_waiter_served_while_another_is_frozen_passes_rule_4() {
        let verdict = check(
            &frozen_waiter(Some(350)),
            &ResourceState::default(),
            TTL_MS,
            PLAIN,
        );
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        // The frozen waiter's own wait does not count while it is paused.
        assert!(verdict.total().longest_wait_ttl < 0.2);
    }

    #[test]
    fn a_paused_holder_keeps_the_key_within_the_bound() {
        // The holder is paused at 100 ms; its lease runs out at 1000 ms; the waiter is granted
        // at 1900 ms: 1.8 TTLs from the pause.
        let history = vec![
            grant(0, 1, 1, 10),
            acquire(50, 2, 1),
            fault(100, 1, "pause", Some(1)),
            grant(1900, 2, 1, 11),
            healed(2200, 1),
        ];
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        let pause = &verdict.by_kind["pause"];
        assert!((pause.longest_wait_ttl - 1.8).abs() < 1e-9, "{pause:?}");

        // The same grant at 2200 ms is past the bound; with the store's delays it is not.
        let mut late = history.clone();
        late[3] = grant(2200, 2, 1, 11);
        assert!(check(&late, &ResourceState::default(), TTL_MS, PLAIN).broke(4));
        let postgres = crate::faults::delays_of("postgres");
        assert!(check(&late, &ResourceState::default(), TTL_MS, postgres).is_safe());
    }

    #[test]
    fn rule_4_is_off_while_the_store_is_unavailable_and_stops_at_the_stop() {
        // PostgreSQL restarts from 100 ms to 3000 ms; the waiter is granted 1 s after.
        let history = vec![
            grant(0, 1, 1, 10),
            release(50, 1, 1, 10),
            acquire(60, 2, 1),
            fault(100, 1, "pg-restart", None),
            healed(3000, 1),
            grant(4000, 2, 1, 11),
            acquire(4100, 3, 1),
            at(4200, 0, Event::Stop),
            // After the stop, no one is granted: the run is ending.
            release(9000, 2, 1, 11),
        ];
        let postgres = crate::faults::delays_of("postgres");
        let verdict = check(&history, &ResourceState::default(), TTL_MS, postgres);
        assert!(verdict.is_safe(), "{:#?}", verdict.violations);
        // Not so where the store does not document the restart as making it unavailable.
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(4), "{:#?}", verdict.violations);
    }

    /// A leader's grant at 1 s and its resign at 2 s (it led 1 s, past twice the observer's
    /// bound of 350 ms), with the observer started at 0 and yielding `observed` (ms, term).
    fn observed_leadership(observed: &[(u64, Option<u64>)], store_fault: bool) -> Vec<Entry> {
        let observer = crate::worker::OBSERVER;
        let mut history = vec![at(0, observer, Event::Start { pid: 0 })];
        history.extend(
            observed
                .iter()
                .map(|&(t, term)| at(t, observer, Event::Observed { term })),
        );
        history.push(acquire(990, 1, 1));
        let mut leading = grant(1000, 1, 1, 10);
        if let Event::Grant { leader, .. } = &mut leading.event {
            *leader = true;
        }
        history.push(leading);
        if store_fault {
            history.push(fault(900, 1, "redis-restart", None));
            history.push(healed(1200, 1));
        }
        history.push(release(2000, 1, 1, 10));
        history.sort_by_key(|e| e.t);
        history
    }

    #[test]
    fn a_leader_the_observer_sees_within_its_bound_passes_rule_5() {
        let history = observed_leadership(&[(5, None), (1100, Some(10)), (2050, None)], false);
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(!verdict.broke(5), "{:?}", verdict.violations);
    }

    #[test]
    fn a_leader_the_observer_never_sees_breaks_rule_5() {
        let history = observed_leadership(&[(5, None), (1500, Some(10))], false);
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(5), "{:?}", verdict.violations);
        // During a store fault the observer may fall behind.
        let history = observed_leadership(&[(5, None), (1500, Some(10))], true);
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(!verdict.broke(5), "{:?}", verdict.violations);
    }

    #[test]
    fn an_observer_that_goes_back_a_term_breaks_rule_5() {
        let history =
            observed_leadership(&[(5, Some(9)), (1100, Some(10)), (1300, Some(9))], false);
        let verdict = check(&history, &ResourceState::default(), TTL_MS, PLAIN);
        assert!(verdict.broke(5), "{:?}", verdict.violations);
    }
}
