//! The checker: reads a whole history and the resource's end state, and proves (or refutes)
//! that nothing unsafe was accepted.
//!
//! Violations (any one fails the run):
//! 1. **Stale write accepted**: the fenced row's accepted writes, in the order the resource
//!    accepted them (its log's serial ids), must carry strictly increasing tokens.
//! 2. **Lost update**: the fenced counter equals the number of its accepted writes, and each
//!    accepted write read the value the previous one wrote.
//! 3. **Unexplained refusal**: every refused claim or write on the fenced row belongs to a lease
//!    that was lost: its lost signal fired at or before the refusal, or its local deadline had
//!    passed, or a fault the store documents as freeing locks early hit it (the fault began
//!    before the refusal and ended after the lease's grant). Otherwise the store let a second holder in while the first still held
//!    the lock by the contract: a store bug.
//!
//! Counted, not failed: critical sections that overlapped in real time, updates lost on the
//! row checked only at the write and on the unfenced shadow row (expected under pauses), lost
//! signals, and for each fault the time until the next grant, in TTLs.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{Entry, Event, Row};
use crate::resource::{Accepted, ResourceState};

/// What the checker found in one store's run.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// Per fault kind (the window from a fault until the next one; `none` before the first),
    /// and `all` for the whole run.
    pub by_kind: BTreeMap<String, Stats>,
    /// Every violation, each with the history excerpt that shows it.
    pub violations: Vec<Violation>,
}

impl Verdict {
    /// Whether no rule was broken.
    pub fn is_safe(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether some violation broke `rule` (1, 2 or 3).
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
}

/// A broken rule, with the part of the history that shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// 1 stale write accepted, 2 lost update, 3 unexplained refusal.
    pub rule: u8,
    /// What is wrong, in one line.
    pub summary: String,
    /// The entries of the leases involved (and faults meanwhile), one JSON object per line.
    pub excerpt: Vec<String>,
}

/// The window name of the whole run.
pub const ALL: &str = "all";
/// The window name before the first fault.
pub const NONE: &str = "none";

/// Checks a history (ordered by time) against the resource's end state. `ttl_ms` is the
/// lease TTL the workers asked for.
pub fn check(history: &[Entry], resource: &ResourceState, ttl_ms: u64) -> Verdict {
    let index = Index::new(history);
    let mut by_kind: BTreeMap<String, Stats> = BTreeMap::new();
    let mut violations = Vec::new();
    let mut bump = |kind: &str, f: &dyn Fn(&mut Stats)| {
        f(by_kind.entry(kind.to_string()).or_default());
        f(by_kind.entry(ALL.to_string()).or_default());
    };

    for entry in history {
        let kind = index.window(entry.t);
        match &entry.event {
            Event::Grant { .. } => bump(kind, &|s| s.acquisitions += 1),
            Event::Lost { .. } => bump(kind, &|s| s.lost_signals += 1),
            Event::Fault { kind, .. } => {
                let unavailable = index.unavailable_ttl(entry.t, ttl_ms);
                bump(kind, &|s| {
                    s.faults += 1;
                    s.worst_unavailable_ttl = s.worst_unavailable_ttl.max(unavailable);
                });
            }
            Event::Read {
                row: Row::Fenced,
                value: None,
                ..
            }
            | Event::Write {
                row: Row::Fenced,
                log_id: None,
                ..
            } => {
                bump(kind, &|s| s.stale_refused += 1);
                if let Some(v) = index.unexplained_refusal(entry) {
                    violations.push(v);
                }
            }
            _ => {}
        }
    }

    // Rules 1 and 2 from the resource's own order of the fenced row's writes.
    let mut highest: Option<&Accepted> = None;
    let mut current = 0i64;
    let mut fenced_writes = 0i64;
    for write in resource.accepted.iter().filter(|w| w.row == Row::Fenced) {
        let kind = index.window_of_lease(write.worker, write.lease);
        fenced_writes += 1;
        bump(kind, &|s| s.writes_accepted += 1);
        if let Some(prev) = highest.filter(|p| write.token <= p.token) {
            bump(kind, &|s| s.stale_accepted += 1);
            violations.push(Violation {
                rule: 1,
                summary: format!(
                    "stale write accepted: log id {} (worker {} lease {} token {}) after log id {} (worker {} lease {} token {})",
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
                    "lost update: log id {} (worker {} lease {} token {}) read {} but the counter held {}",
                    write.id, write.worker, write.lease, write.token, write.read_value, current
                ),
                excerpt: index.excerpt(&[(write.worker, write.lease)]),
            });
        }
        current = write.new_value;
    }

    // The other rows' lost updates: the writes whose increment the final value does not
    // contain. Walking back from the final value, each surviving write is the latest one that
    // wrote the value its successor read; every other write was overwritten.
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
            match row {
                Row::WriteOnly => bump(kind, &|s| s.lost_write_only += 1),
                _ => bump(kind, &|s| s.lost_shadow += 1),
            }
        }
    }
    if resource.fenced != fenced_writes {
        let last: Vec<(u32, u64)> = resource
            .accepted
            .iter()
            .rev()
            .filter(|a| a.row == Row::Fenced)
            .take(2)
            .map(|a| (a.worker, a.lease))
            .collect();
        violations.push(Violation {
            rule: 2,
            summary: format!(
                "lost update: the fenced counter is {} but the resource accepted {} writes",
                resource.fenced, fenced_writes
            ),
            excerpt: index.excerpt(&last),
        });
    }

    for (kind, overlaps) in index.overlaps() {
        bump(kind, &|s| s.overlaps += overlaps);
    }
    by_kind.entry(ALL.to_string()).or_default();
    Verdict {
        by_kind,
        violations,
    }
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
        };
        for e in history {
            match &e.event {
                Event::Fault { kind, .. } => index.faults.push((e.t, kind)),
                Event::Grant { lease, .. } => {
                    index.grants.insert((e.worker, *lease), e.t);
                    index.grant_times.push(e.t);
                }
                Event::Lost { lease, .. } => {
                    index.lost_at.entry((e.worker, *lease)).or_insert(e.t);
                }
                Event::Healed { id } => {
                    index.healed.insert(*id, e.t);
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
        // A fault hits the leases granted before it ended (a lease granted while a restart or a
        // terminate was under way may be among those it freed) and explains refusals after it
        // began.
        let freed_early = self.history.iter().any(|e| match &e.event {
            Event::Fault {
                id,
                frees_early: true,
                target,
                ..
            } => {
                let ended = self.healed.get(id).copied().unwrap_or(e.t);
                target.is_none_or(|w| w == refusal.worker) && granted <= ended && e.t <= refusal.t
            }
            _ => false,
        });
        if signalled || expired || freed_early {
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
        const MAX_LINES: usize = 40;
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
        if lines.len() <= MAX_LINES {
            return lines;
        }
        // Keep the start and the end, where the leases begin and the violation is.
        let mut kept = lines[..MAX_LINES / 2].to_vec();
        kept.push(format!(
            "... {} entries left out ...",
            lines.len() - MAX_LINES
        ));
        kept.extend_from_slice(&lines[lines.len() - MAX_LINES / 2..]);
        kept
    }

    /// Overlapping critical sections (grant to the lease's last answer from the resource),
    /// counted once per later section, attributed to that section's window.
    fn overlaps(&self) -> HashMap<&'h str, u64> {
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
        let mut sorted: Vec<(u64, u64)> = sections.into_values().collect();
        sorted.sort_unstable();
        let mut counts: HashMap<&'h str, u64> = HashMap::new();
        let mut latest_end = 0u64;
        for (i, &(start, end)) in sorted.iter().enumerate() {
            if i > 0 && start < latest_end {
                *counts.entry(self.window(start)).or_default() += 1;
            }
            latest_end = latest_end.max(end);
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const TTL_MS: u64 = 1000;

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
            },
        )
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
            grant(3, 2, 1, 11),
            read(4, 2, 1, 11, Some(1)),
            write(5, 2, 1, 11, Some(2)),
        ];
        let resource = ResourceState {
            fenced: 2,
            accepted: vec![accepted(1, 10, 1, 1, 0), accepted(2, 11, 2, 1, 1)],
            ..ResourceState::default()
        };
        (history, resource)
    }

    #[test]
    fn a_clean_history_passes() {
        let (history, resource) = clean_history();
        let verdict = check(&history, &resource, TTL_MS);
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
        let verdict = check(&history, &resource, TTL_MS);
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
        let verdict = check(&history, &resource, TTL_MS);
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
        let verdict = check(&history, &resource, TTL_MS);
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
        let verdict = check(&history, &resource, TTL_MS);
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
        let verdict = check(&history, &resource, TTL_MS);
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
        assert!(check(&history, &resource, TTL_MS).is_safe());
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
        history.insert(6, fault(true));
        history.push(write(8, 2, 1, 11, None));
        assert!(check(&history, &resource, TTL_MS).is_safe());

        let (mut history, resource) = clean_history();
        history.insert(6, fault(false));
        history.push(write(8, 2, 1, 11, None));
        assert!(check(&history, &resource, TTL_MS).broke(3));

        // A lease granted while the fault was under way is hit by it.
        let (mut history, resource) = clean_history();
        history.insert(6, fault(true));
        history.push(grant(8, 3, 1, 12));
        history.push(at(9, 0, Event::Healed { id: 1 }));
        history.push(write(10, 3, 1, 12, None));
        assert!(check(&history, &resource, TTL_MS).is_safe());

        // A lease granted after the fault is not explained by it.
        let (mut history, resource) = clean_history();
        history.insert(6, fault(true));
        history.push(grant(9, 3, 1, 5));
        history.push(read(10, 3, 1, 5, None));
        assert!(check(&history, &resource, TTL_MS).broke(3));
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
        let verdict = check(&history, &resource, TTL_MS);
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
            // The paused holder's write lands after the next holder was granted.
            write(2000, 1, 1, 10, None),
            write(2100, 2, 1, 11, Some(1)),
        ];
        let resource = ResourceState {
            fenced: 1,
            accepted: vec![accepted(1, 11, 2, 1, 0)],
            ..ResourceState::default()
        };
        let verdict = check(&history, &resource, TTL_MS);
        let pause = &verdict.by_kind["pause"];
        assert_eq!(pause.overlaps, 1);
        assert_eq!(pause.faults, 1);
        assert!((pause.worst_unavailable_ttl - 1.0).abs() < 1e-9);
    }
}
