//! The report: a table per store and fault kind, the violations with their history excerpts,
//! or the same as JSON.

use std::fmt::Write as _;

use crate::checker::{Stats, ALL};
use crate::run::StoreReport;

/// The table header, in the order of [`row`].
const HEADER: [&str; 12] = [
    "store",
    "fault",
    "faults",
    "acquisitions",
    "writes accepted",
    "stale refused",
    "stale accepted",
    "overlaps",
    "lost updates, write-only row",
    "lost updates, shadow",
    "lost signals",
    "longest unavailability (× TTL)",
];

fn row(store: &str, kind: &str, s: &Stats) -> [String; 12] {
    [
        store.to_string(),
        kind.to_string(),
        s.faults.to_string(),
        s.acquisitions.to_string(),
        s.writes_accepted.to_string(),
        s.stale_refused.to_string(),
        s.stale_accepted.to_string(),
        s.overlaps.to_string(),
        s.lost_write_only.to_string(),
        s.lost_shadow.to_string(),
        s.lost_signals.to_string(),
        if s.faults == 0 && kind != ALL {
            "–".to_string()
        } else {
            format!("{:.2}", s.worst_unavailable_ttl)
        },
    ]
}

/// The Markdown table of every store's run, then each store's verdict and violations.
pub fn table(reports: &[StoreReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(HEADER.len()));
    for report in reports {
        // The fault windows first, the whole run last.
        let mut kinds: Vec<(&String, &Stats)> = report
            .verdict
            .by_kind
            .iter()
            .filter(|(k, _)| k.as_str() != ALL)
            .collect();
        kinds.extend(report.verdict.by_kind.get_key_value(ALL));
        for (kind, stats) in kinds {
            let mut cells = row(&report.store, kind, stats);
            if kind == ALL {
                cells = cells.map(|c| format!("**{c}**"));
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out.push('\n');
    for report in reports {
        let verdict = if report.verdict.is_safe() {
            "safe: no stale write accepted, no lost update, no unexplained refusal".to_string()
        } else {
            format!("{} VIOLATION(S)", report.verdict.violations.len())
        };
        let _ = writeln!(
            out,
            "{}: {verdict} (seed {}, TTL {} ms, {} workers, faults: {})",
            report.store,
            report.seed,
            report.ttl_ms,
            report.workers,
            report.faults.join(", ")
        );
        if let Some(path) = &report.history {
            let _ = writeln!(out, "  history: {}", path.display());
        }
        for v in &report.verdict.violations {
            let _ = writeln!(out, "  rule {}: {}", v.rule, v.summary);
            for line in &v.excerpt {
                let _ = writeln!(out, "    {line}");
            }
        }
    }
    out
}

/// The reports as one JSON document.
pub fn json(reports: &[StoreReport]) -> String {
    serde_json::to_string_pretty(reports).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
