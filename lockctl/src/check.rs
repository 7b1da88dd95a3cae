//! `lockctl conformance`: the suite against a live store behind a URL.

use std::process::ExitCode;
use std::sync::Arc;

use fencelock::DynLockStore;
use fencelock_conformance::{async_trait, StoreFactory};

/// Handles to the store behind a URL; a lease is forgotten by the store's own eviction.
struct UrlFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for UrlFactory {
    async fn handle(&self) -> DynLockStore {
        match fencelock::connect(&self.url).await {
            Ok(store) => store,
            // The suite's cases report errors from the store itself; this makes them do so.
            Err(error) => panic!(
                "cannot connect to {}: {error}",
                fencelock::redact(&self.url)
            ),
        }
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        match fencelock::faults::unreachable(&self.url).await {
            Ok(store) => store,
            Err(error) => panic!("cannot build an unreachable handle: {error}"),
        }
    }
}

pub(crate) async fn conformance(url: &str, parallel: usize, cases: &[String]) -> ExitCode {
    let selected = |name: &str| cases.is_empty() || cases.iter().any(|c| name.contains(c.as_str()));
    if !fencelock_conformance::CASES
        .iter()
        .any(|case| selected(case.name))
    {
        eprintln!(
            "lockctl: no conformance case matches {}",
            cases.join(", ").escape_debug()
        );
        return ExitCode::from(crate::exit::USAGE);
    }
    if let Err(error) = crate::connect(url, std::time::Duration::from_secs(10)).await {
        return crate::fail(&error);
    }
    println!("conformance suite against {}", fencelock::redact(url));
    let factory = Arc::new(UrlFactory {
        url: url.to_owned(),
    });
    let report = fencelock_conformance::run_matching(factory, parallel, selected).await;
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
