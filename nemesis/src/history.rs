//! The history: every step of every worker and every fault, stamped with `CLOCK_MONOTONIC`.
//!
//! Workers write one JSON object per line ([`Entry`]); the controller adds the faults and
//! merges everything into one list ordered by time.

use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// One step, with when it happened (ns on `CLOCK_MONOTONIC`) and which worker took it (the
/// controller is worker 0 for faults).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Nanoseconds on `CLOCK_MONOTONIC`, read after the step's answer arrived.
    pub t: u64,
    /// The worker (1, 2, …); 0 for the controller.
    pub worker: u32,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// Which row of the resource a read or a write went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Row {
    /// Claimed at the read, written only while the claim holds (exclusive holders); read
    /// only while no greater token claimed it (readers).
    Fenced,
    /// Read plainly, written `WHERE fence < token`: the check at the write alone.
    WriteOnly,
    /// Read and written without any check.
    Shadow,
    /// A permit slot's own fenced row (docs/modes.md, "Semaphores and reader-writer locks": one fence
    /// per slot), claimed and written like [`Row::Fenced`] by the permit holding that slot.
    Slot(u32),
}

impl Row {
    /// The row's id in the resource table.
    pub fn id(self) -> i64 {
        match self {
            Row::Fenced => 1,
            Row::WriteOnly => 2,
            Row::Shadow => 3,
            Row::Slot(slot) => 100 + i64::from(slot),
        }
    }

    /// The row with id `id`.
    pub fn from_id(id: i64) -> Option<Row> {
        match id {
            1 => Some(Row::Fenced),
            2 => Some(Row::WriteOnly),
            3 => Some(Row::Shadow),
            100.. => u32::try_from(id - 100).ok().map(Row::Slot),
            _ => None,
        }
    }

    /// Whether the row is fenced (claim at the read, write under the claim): the rows the
    /// checker's rules 1 to 3 hold to.
    pub fn is_fenced(self) -> bool {
        matches!(self, Row::Fenced | Row::Slot(_))
    }
}

/// How a worker holds the key: [`fencelock::Mode`] as the history writes it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WorkMode {
    /// The only holder: claims and writes the fenced row (and the two unchecked rows).
    #[default]
    Exclusive,
    /// A reader: reads the fenced row while no writer with a greater token claimed it.
    Shared,
    /// One of `limit` permits: claims and writes its slot's row.
    Permit {
        /// The key's number of permits.
        limit: u32,
    },
}

impl WorkMode {
    /// The lock mode to ask the store for.
    pub fn to_mode(self) -> fencelock::Mode {
        match self {
            WorkMode::Exclusive => fencelock::Mode::Exclusive,
            WorkMode::Shared => fencelock::Mode::Shared,
            WorkMode::Permit { limit } => fencelock::Mode::permits(limit),
        }
    }

    /// Whether leases in these two modes may be held at once (permits: up to the limit).
    pub fn compatible_with(self, other: WorkMode) -> bool {
        self.to_mode().compatible_with(other.to_mode())
    }

    /// The name in the report (`exclusive`, `shared`, `permit of 2`).
    pub fn name(self) -> String {
        self.to_mode().to_string()
    }

    /// The mode named like `exclusive`, `shared` or `permits:2` (the worker's command line).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "exclusive" => Some(WorkMode::Exclusive),
            "shared" => Some(WorkMode::Shared),
            _ => text
                .strip_prefix("permits:")
                .and_then(|n| n.parse().ok())
                .map(|limit| WorkMode::Permit { limit }),
        }
    }

    /// The inverse of [`WorkMode::parse`].
    pub fn arg(self) -> String {
        match self {
            WorkMode::Exclusive => "exclusive".to_string(),
            WorkMode::Shared => "shared".to_string(),
            WorkMode::Permit { limit } => format!("permits:{limit}"),
        }
    }
}

/// A step. `lease` numbers a worker's acquisitions (1, 2, …), so `(worker, lease)` names one
/// lease; `deadline` is the lease's local deadline (ns) as the worker saw it at that step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum Event {
    /// The worker started (its process id, where it is a process).
    Start {
        /// The worker's process id, 0 for a task.
        pid: u32,
    },
    /// The worker asks for the lock, waiting.
    Acquire {
        /// The lease number this acquisition will have.
        lease: u64,
        /// The mode asked for.
        #[serde(default)]
        mode: WorkMode,
    },
    /// The store granted the lock.
    Grant {
        /// The lease number.
        lease: u64,
        /// Its fencing token.
        token: u64,
        /// Its TTL in milliseconds.
        ttl_ms: u64,
        /// Its local deadline.
        deadline: u64,
        /// Its mode.
        #[serde(default)]
        mode: WorkMode,
        /// A permit's slot.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
        /// Whether the lease is a leadership of the election on the key.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        leader: bool,
    },
    /// The acquisition failed (wait ran out, store unreachable).
    AcquireFailed {
        /// The lease number it would have had.
        lease: u64,
        /// The error.
        error: String,
    },
    /// A read of a row: on the fenced row it is the claim, refused if a greater token claimed.
    Read {
        /// The lease number.
        lease: u64,
        /// Its fencing token.
        token: u64,
        /// Which row.
        row: Row,
        /// The value read, `None` when the claim was refused.
        value: Option<i64>,
        /// The local deadline at that moment.
        deadline: u64,
        /// Whether the keep-alive's lost signal had fired.
        lost: bool,
    },
    /// A write of a row, accepted or refused by the resource.
    Write {
        /// The lease number.
        lease: u64,
        /// Its fencing token.
        token: u64,
        /// Which row.
        row: Row,
        /// The resource's log id of the accepted write, `None` when refused.
        log_id: Option<i64>,
        /// The local deadline at that moment.
        deadline: u64,
        /// Whether the keep-alive's lost signal had fired.
        lost: bool,
    },
    /// The keep-alive's lost signal fired.
    Lost {
        /// The lease number.
        lease: u64,
        /// Its fencing token.
        token: u64,
        /// Why, as the keep-alive said.
        reason: String,
    },
    /// The worker released the lease.
    Release {
        /// The lease number.
        lease: u64,
        /// Its fencing token.
        token: u64,
        /// `released`, `lost`, or the error.
        outcome: String,
        /// When the release was sent (the lease is held until then, at most).
        #[serde(default)]
        sent: u64,
    },
    /// A step failed in a way the run does not expect (the resource unreachable).
    Error {
        /// What failed.
        what: String,
    },
    /// The nemesis injected a fault.
    Fault {
        /// The fault's number in this run.
        id: u32,
        /// Its kind, as named in `--faults`.
        kind: String,
        /// The worker it hit, or `None` for the store as a whole.
        target: Option<u32>,
        /// Whether the store documents this event as freeing locks early.
        frees_early: bool,
        /// What was done, for the report.
        detail: String,
    },
    /// The fault was healed (the process resumed, the server restarted, the relay thawed).
    Healed {
        /// The fault's number.
        id: u32,
    },
    /// An observer of the election on the key saw its leader change: the leader's term, or
    /// `None` when nobody led (or the key was held in another mode).
    Observed {
        /// The leader's term.
        term: Option<u64>,
    },
    /// The controller stopped the workers: a wait after this is the run ending, not the store.
    Stop,
}

impl Event {
    /// The lease number, for the steps that belong to a lease.
    pub fn lease(&self) -> Option<u64> {
        match self {
            Event::Acquire { lease, .. }
            | Event::Grant { lease, .. }
            | Event::AcquireFailed { lease, .. }
            | Event::Read { lease, .. }
            | Event::Write { lease, .. }
            | Event::Lost { lease, .. }
            | Event::Release { lease, .. } => Some(*lease),
            _ => None,
        }
    }
}

/// A history being recorded by many writers at once.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Recorder {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry.
    pub fn push(&self, entry: Entry) {
        self.lock().push(entry);
    }

    /// The entries so far, ordered by time (ties keep the order they were recorded in).
    pub fn snapshot(&self) -> Vec<Entry> {
        let mut entries = self.lock().clone();
        entries.sort_by_key(|e| e.t);
        entries
    }

    /// Calls `f` on the entries recorded so far, in the order recorded.
    pub fn with<R>(&self, f: impl FnOnce(&[Entry]) -> R) -> R {
        f(&self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_one_json_object_each() {
        let entry = Entry {
            t: 7,
            worker: 2,
            event: Event::Write {
                lease: 3,
                token: 40,
                row: Row::Fenced,
                log_id: Some(9),
                deadline: 11,
                lost: false,
            },
        };
        let line = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            line,
            r#"{"t":7,"worker":2,"ev":"write","lease":3,"token":40,"row":"fenced","log_id":9,"deadline":11,"lost":false}"#
        );
        assert_eq!(serde_json::from_str::<Entry>(&line).unwrap(), entry);
    }

    #[test]
    fn modes_and_slot_rows_round_trip_and_old_lines_read_as_exclusive() {
        for mode in [
            WorkMode::Exclusive,
            WorkMode::Shared,
            WorkMode::Permit { limit: 2 },
        ] {
            assert_eq!(WorkMode::parse(&mode.arg()), Some(mode));
        }
        for row in [Row::Fenced, Row::WriteOnly, Row::Shadow, Row::Slot(3)] {
            assert_eq!(Row::from_id(row.id()), Some(row));
        }
        let grant = Entry {
            t: 1,
            worker: 1,
            event: Event::Grant {
                lease: 1,
                token: 5,
                ttl_ms: 1000,
                deadline: 9,
                mode: WorkMode::Permit { limit: 2 },
                slot: Some(1),
                leader: false,
            },
        };
        let line = serde_json::to_string(&grant).unwrap();
        assert_eq!(serde_json::from_str::<Entry>(&line).unwrap(), grant);
        // A line written before modes existed is an exclusive grant.
        let old =
            r#"{"t":1,"worker":1,"ev":"grant","lease":1,"token":5,"ttl_ms":1000,"deadline":9}"#;
        match serde_json::from_str::<Entry>(old).unwrap().event {
            Event::Grant { mode, slot, .. } => {
                assert_eq!((mode, slot), (WorkMode::Exclusive, None))
            }
            other => panic!("{other:?}"),
        }
    }
}
