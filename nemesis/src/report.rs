//! The report: a table per store with a row per fault kind and per mode, the violations with
//! their history excerpts, or the same as JSON.

use std::fmt::Write as _;

use crate::checker::{Stats, ALL};
use crate::run::StoreReport;

/// The table header, in the order of [`row`].
const HEADER: [&str; 13] = [
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
    "longest unserved wait (× TTL, rule 4)",
];

/// A row of the table; `bound` is rule 4's bound in TTLs, shown on the `all` row.
fn row(store: &str, kind: &str, s: &Stats, bound: Option<f64>) -> [String; 13] {
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
        match bound {
            Some(bound) => format!("{:.2} (bound {bound:.2})", s.longest_wait_ttl),
            None => format!("{:.2}", s.longest_wait_ttl),
        },
    ]
}

/// The Markdown table of every store's run, then each store's verdict and violations.
pub fn table(reports: &[StoreReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(HEADER.len()));
    for report in reports {
        // The fault windows first, then the modes (when the run mixed them), the whole run
        // last. A mode row has no faults of its own.
        let mut rows: Vec<(String, &Stats)> = report
            .verdict
            .by_kind
            .iter()
            .filter(|(k, _)| k.as_str() != ALL)
            .map(|(k, s)| (k.clone(), s))
            .collect();
        if report.verdict.by_mode.len() > 1 {
            rows.extend(
                report
                    .verdict
                    .by_mode
                    .iter()
                    .map(|(m, s)| (format!("mode: {m}"), s)),
            );
        }
        rows.extend(
            report
                .verdict
                .by_kind
                .get_key_value(ALL)
                .map(|(k, s)| (k.clone(), s)),
        );
        for (kind, stats) in rows {
            let mut cells = if kind == ALL {
                row(&report.store, &kind, stats, Some(report.verdict.bound_ttl))
            } else if kind.starts_with("mode: ") {
                let mut cells = row(&report.store, &kind, stats, None);
                cells[2] = "–".to_string();
                cells[11] = "–".to_string();
                cells
            } else {
                row(&report.store, &kind, stats, None)
            };
            if kind == ALL {
                cells = cells.map(|c| format!("**{c}**"));
            }
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
    }
    out.push('\n');
    for report in reports {
        let verdict = if report.verdict.is_safe() {
            "safe: no stale write accepted, no lost update, no second holder let in, no wait past the bound, no observer behind, no waiter passed".to_string()
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
