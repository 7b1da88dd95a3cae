//! `nemesis`: the fault run. See nemesis/README.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use nemesis::history::WorkMode;
use nemesis::worker::WorkerConfig;
use nemesis::{Fault, FaultProfile, Options};

/// Many clients doing fenced work on a shared PostgreSQL counter while faults hit the lock
/// store and the clients; exits non-zero if the checker finds a stale write accepted, a lost
/// update or an unexplained refusal.
#[derive(Debug, Parser)]
#[command(name = "nemesis", version)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// A live store to run against (client faults only); without it each store is started.
    #[arg(long)]
    url: Option<String>,
    /// The stores to start, comma-separated, by name (an unknown name is refused with the
    /// list; broken-memory is nemesis's own); default: every store it can start.
    #[arg(long, value_delimiter = ',')]
    stores: Vec<String>,
    /// Only these faults, comma-separated (default: every fault that applies).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// How long faults are injected, per store.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Workers at any time.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Lease TTL (etcd rounds up to whole seconds).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ttl: Duration,
    /// Longest hold inside the read-modify-write.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    hold: Duration,
    /// The nemesis's seed (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The resource's PostgreSQL URL (default: one is started).
    #[arg(long)]
    resource_url: Option<String>,
    /// Where to write the histories (default: a directory under the temp dir, printed).
    #[arg(long)]
    history_dir: Option<PathBuf>,
    /// The report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// One worker process (started by the controller).
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        id: u32,
        #[arg(long)]
        store_url: String,
        #[arg(long)]
        resource_url: String,
        #[arg(long)]
        schema: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        hold_ms: u64,
        #[arg(long, default_value = "exclusive", value_parser = parse_mode)]
        mode: WorkMode,
    },
}

fn parse_mode(text: &str) -> Result<WorkMode, String> {
    WorkMode::parse(text).ok_or_else(|| format!("{text:?}: exclusive, shared or permits:N"))
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a number and ms, s or m"))?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" | "" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Mode::Worker {
        id,
        store_url,
        resource_url,
        schema,
        ttl_ms,
        hold_ms,
        mode,
    }) = cli.mode
    {
        return nemesis::worker::run_process(
            &store_url,
            WorkerConfig {
                id,
                ttl: Duration::from_millis(ttl_ms),
                hold_max: Duration::from_millis(hold_ms),
                resource_url,
                schema,
                mode,
            },
        );
    }
    let stores = if cli.stores.is_empty() {
        FaultProfile::startable().collect()
    } else {
        match cli
            .stores
            .iter()
            .map(|s| FaultProfile::parse(s).ok_or(s))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(stores) => stores,
            Err(s) => {
                let known: Vec<&str> = FaultProfile::startable()
                    .chain([nemesis::faults::BROKEN_MEMORY])
                    .map(|p| p.name())
                    .collect();
                eprintln!(
                    "nemesis: unknown store {s:?}, or one it cannot start (known: {}; any other \
                     store of the facade runs with --url)",
                    known.join(", ")
                );
                return ExitCode::from(64);
            }
        }
    };
    let faults = if cli.faults.is_empty() {
        None
    } else {
        match cli
            .faults
            .iter()
            .map(|f| Fault::parse(f).ok_or(f))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(faults) => Some(faults),
            Err(f) => {
                let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                eprintln!("nemesis: unknown fault {f:?} (known: {})", known.join(", "));
                return ExitCode::from(64);
            }
        }
    };
    let seed = cli.seed.unwrap_or_else(rand::random);
    let history_dir = cli
        .history_dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("nemesis-{seed}")));
    eprintln!(
        "nemesis: seed {seed} (replay with --seed {seed}); histories in {}",
        history_dir.display()
    );
    let worker_binary = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("nemesis: cannot find my own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = Options {
        url: cli.url,
        stores,
        faults,
        duration: cli.duration,
        workers: cli.workers,
        ttl: cli.ttl,
        hold_max: cli.hold,
        seed,
        resource_url: cli.resource_url,
        worker_binary,
        history_dir: Some(history_dir),
        verbose: true,
    };
    let reports = match nemesis::run(&options) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!("nemesis: {e}");
            return ExitCode::from(69);
        }
    };
    if cli.json {
        println!("{}", nemesis::report::json(&reports));
    } else {
        print!("{}", nemesis::report::table(&reports));
    }
    if reports.iter().all(|r| r.verdict.is_safe()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
