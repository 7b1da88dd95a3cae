//! `lockctl bench`: cycle, throughput and handoff against a live store, with a round-trip floor.

use std::process::ExitCode;
use std::time::Duration;

use fencelock::{DynLockStore, Error};
use fencelock_bench::{self as bench, Table};

/// The rounds the cycles alternate in.
const ROUNDS: usize = 10;

pub(crate) async fn bench(url: &str, store: DynLockStore, iterations: usize) -> ExitCode {
    match measure(url, store, iterations).await {
        Ok(table) => {
            println!("benchmark against {}", fencelock::redact(url));
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(error) => crate::fail(&error),
    }
}

async fn measure(url: &str, store: DynLockStore, iterations: usize) -> Result<Table, Error> {
    let prefix = format!("lockctl-bench:{:08x}:", std::process::id());
    let ttl = store.capabilities().granted_ttl(Duration::from_secs(10));
    let mut table = Table::default();

    // The floor: one read round trip through the same client (`status`).
    let floor_key = format!("{prefix}floor");
    let floor = bench::time_each(iterations, |_| async {
        store.status(&floor_key).await.map(drop)
    })
    .await;
    let floor = match floor {
        Ok(samples) => Some(samples.p50()),
        Err(Error::Unsupported { .. }) => None,
        Err(error) => return Err(error),
    };
    if let Some(floor) = floor {
        table.latency("round trip (status read), p50", floor);
    }

    // The exclusive cycle and the cycles of the modes the store keeps (a permit of a
    // semaphore, a shared lease), in alternating rounds so all see the same machine load.
    let cycle_key = format!("{prefix}cycle");
    let mut modes = bench::ModeCycles::new(&store.capabilities());
    let mut warm_up = Vec::new();
    bench::cycle_into(&store, &cycle_key, ttl, iterations / 10, &mut warm_up).await?;
    modes
        .warm_up(&store, &cycle_key, ttl, iterations / 10)
        .await?;
    let rounds = ROUNDS.min(iterations).max(1);
    let mut cycles = Vec::with_capacity(iterations);
    for _ in 0..rounds {
        let per_round = iterations.div_ceil(rounds);
        bench::cycle_into(&store, &cycle_key, ttl, per_round, &mut cycles).await?;
        modes.round(&store, &cycle_key, ttl, per_round).await?;
    }
    let cycle = bench::Samples::new(cycles);
    let floor_of_cycle = floor.filter(|f| !f.is_zero()).map(|f| 2 * f);
    let row = table.latency("acquire+release cycle, p50", cycle.p50());
    if let Some(floor) = floor_of_cycle {
        row.ratio(cycle.p50().as_secs_f64() / floor.as_secs_f64(), None);
    }
    table.latency("acquire+release cycle, p99", cycle.p99());
    // Ratios as the exclusive p50 row's: to two round trips.
    for (label, samples) in modes.samples() {
        let row = table.latency(format!("{label} cycle, p50"), samples.p50());
        if let Some(floor) = floor_of_cycle {
            row.ratio(samples.p50().as_secs_f64() / floor.as_secs_f64(), None);
        }
        table.latency(format!("{label} cycle, p99"), samples.p99());
    }

    let rate = bench::lock_throughput(
        store.clone(),
        &format!("{prefix}tp"),
        ttl,
        16,
        Duration::from_secs(2),
    )
    .await?;
    table.rate("throughput, 16 tasks on distinct keys", rate);

    let mut handles = Vec::new();
    for _ in 0..8 {
        handles.push(crate::connect(url, Duration::from_secs(10)).await?);
    }
    // To another waiter, after a short hold: a releaser re-taking its own key is no handoff.
    let handoff = bench::handoff_to_another(
        handles,
        &format!("{prefix}handoff"),
        ttl,
        Duration::from_millis(5),
        200,
    )
    .await?;
    let row = table.latency("handoff to another of 8 waiters, p50", handoff.p50());
    if let Some(floor) = floor.filter(|f| !f.is_zero()) {
        row.ratio(handoff.p50().as_secs_f64() / floor.as_secs_f64(), None);
    }
    table.latency("handoff to another of 8 waiters, p99", handoff.p99());
    Ok(table)
}
