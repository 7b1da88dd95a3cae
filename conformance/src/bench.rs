//! Measurement loops shared by every store's benchmark and `lockctl bench`.
//!
//! Nothing here asserts a timing: benchmarks print figures next to the raw store's own round
//! trip measured in the same run, and a person reads the ratio.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{DynLockStore, Error, Result};
use tokio::time::Instant;

/// Latency samples.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    sorted: Vec<Duration>,
}

impl Samples {
    /// Samples from unsorted durations.
    pub fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Samples { sorted: samples }
    }

    /// The `q` quantile (0.0 to 1.0); zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.sorted[index]
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

/// Times `iterations` sequential calls of `op`, after `iterations / 10` warm-up calls.
pub async fn time_each<F, Fut>(iterations: usize, mut op: F) -> Result<Samples>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for i in 0..iterations / 10 {
        op(i).await?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        let started = Instant::now();
        op(i).await?;
        samples.push(started.elapsed());
    }
    Ok(Samples::new(samples))
}

/// Uncontended acquire + release cycles on one key.
pub async fn cycle(
    store: &DynLockStore,
    key: &str,
    ttl: Duration,
    iterations: usize,
) -> Result<Samples> {
    time_each(iterations, |_| async {
        let lease = store.try_acquire(key, ttl).await?;
        store.release(&lease).await.map(drop)
    })
    .await
}

/// Runs `op(task, iteration)` in `tasks` concurrent loops for `duration`; returns completed
/// operations per second.
pub async fn throughput<F, Fut>(tasks: usize, duration: Duration, op: F) -> Result<f64>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut joins = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (op, stop, done) = (op.clone(), stop.clone(), done.clone());
        joins.push(tokio::spawn(async move {
            let mut iteration = 0;
            while !stop.load(Ordering::Relaxed) {
                op(task, iteration).await?;
                iteration += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for join in joins {
        join.await.map_err(|e| Error::Store {
            message: format!("a benchmark task panicked: {e}"),
            source: None,
        })??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Acquire + release cycles per second with `tasks` tasks, each on its own key.
pub async fn lock_throughput(
    store: DynLockStore,
    key_prefix: &str,
    ttl: Duration,
    tasks: usize,
    duration: Duration,
) -> Result<f64> {
    let prefix = key_prefix.to_owned();
    throughput(tasks, duration, move |task, _| {
        let (store, key) = (store.clone(), format!("{prefix}{task}"));
        async move {
            let lease = store.try_acquire(&key, ttl).await?;
            store.release(&lease).await.map(drop)
        }
    })
    .await
}

/// Handoff latency: the time from a holder starting its release to the next waiter holding the
/// key, with one waiter task per handle all contending for `key`, until `handoffs` samples.
pub async fn handoff(
    handles: Vec<DynLockStore>,
    key: &str,
    ttl: Duration,
    handoffs: usize,
) -> Result<Samples> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut joins = Vec::new();
    for store in handles {
        let (key, released_at, samples) = (key.to_owned(), released_at.clone(), samples.clone());
        joins.push(tokio::spawn(async move {
            loop {
                let lease = store.acquire(&key, ttl, Duration::from_secs(30)).await?;
                let now = Instant::now();
                let finished = {
                    let mut samples = samples.lock().unwrap_or_else(PoisonError::into_inner);
                    let previous = released_at
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    if let Some(previous) = previous {
                        samples.push(now - previous);
                    }
                    samples.len() >= handoffs
                };
                *released_at.lock().unwrap_or_else(PoisonError::into_inner) =
                    (!finished).then(Instant::now);
                let _outcome = store.release(&lease).await?;
                if finished {
                    return Ok::<_, Error>(());
                }
            }
        }));
    }
    let (first, _, rest) = futures_util::future::select_all(joins).await;
    first.map_err(|e| Error::Store {
        message: format!("a benchmark task panicked: {e}"),
        source: None,
    })??;
    // The others are parked in acquire with nothing left to hand them; stop them.
    for join in rest {
        join.abort();
    }
    let samples = samples
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(Samples::new(samples))
}

/// One line of a benchmark table.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// The figure, formatted.
    pub figure: String,
    /// The ratio to the raw floor, if any.
    pub ratio: Option<f64>,
    /// The target, in words, and whether it was met.
    pub target: Option<(String, bool)>,
}

/// A benchmark table, printed as aligned text.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Its rows.
    pub rows: Vec<Row>,
}

impl Table {
    /// Adds a latency row.
    pub fn latency(&mut self, what: impl Into<String>, value: Duration) -> &mut Row {
        self.push(what, format!("{:.1} µs", value.as_secs_f64() * 1e6))
    }

    /// Adds a rate row.
    pub fn rate(&mut self, what: impl Into<String>, per_second: f64) -> &mut Row {
        self.push(what, format!("{per_second:.0} /s"))
    }

    /// Adds a row with a preformatted figure.
    pub fn push(&mut self, what: impl Into<String>, figure: String) -> &mut Row {
        self.rows.push(Row {
            what: what.into(),
            figure,
            ratio: None,
            target: None,
        });
        self.rows.last_mut().expect("just pushed")
    }
}

impl Row {
    /// Sets the ratio and, optionally, a target it must meet.
    pub fn ratio(&mut self, ratio: f64, target: Option<(&str, bool)>) -> &mut Self {
        self.ratio = Some(ratio);
        self.target = target.map(|(t, met)| (t.to_owned(), met));
        self
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .rows
            .iter()
            .map(|r| r.what.chars().count())
            .max()
            .unwrap_or(0);
        for row in &self.rows {
            let ratio = row.ratio.map(|r| format!("{r:.2}×")).unwrap_or_default();
            let target = match &row.target {
                Some((target, true)) => format!("target {target}: met"),
                Some((target, false)) => format!("target {target}: MISSED"),
                None => String::new(),
            };
            writeln!(
                f,
                "{:<width$}  {:>14}  {:>8}  {target}",
                row.what, row.figure, ratio
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_sorted_samples() {
        let samples = Samples::new((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(samples.p50(), Duration::from_millis(51));
        assert_eq!(samples.p99(), Duration::from_millis(99));
        assert_eq!(Samples::default().p50(), Duration::ZERO);
    }
}
