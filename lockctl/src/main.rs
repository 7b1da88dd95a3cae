//! `lockctl`: lock a command from the shell on any fencelock store.
//!
//! ```text
//! lockctl --url redis://127.0.0.1:6379 run nightly-export --ttl 30s -- ./export.sh
//! ```
//!
//! Exit codes follow sysexits: the command's own code when it ran; 64 bad input (including a
//! lock mode the store does not keep, and `--permits` disagreeing with the limit the key's
//! permits are held with); 69 store unreachable; 70 lease lost while the command ran (its
//! process group is terminated), or expired before it could start (it never ran); 75 the lock is held by someone else (and the wait, if any, ran
//! out); 76 the store answered with an error.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fencelock::{DynLockStore, Error, ErrorKind, Mode, MAX_PERMITS};

mod bench;
mod check;
mod duration;
mod group;
mod guardian;
mod run;
mod stats;
mod status;
mod usage;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    about = "Distributed locks with fencing tokens, from the shell"
)]
struct Cli {
    /// The store, e.g. sqlite:///var/lib/myapp/locks.db (no server), redis://127.0.0.1:6379,
    /// etcd://h:2379, postgres://u@h/db, mysql://u@h/db, memory://
    ///
    /// TLS (in a build with `--features tls`): rediss://h:6380?tls_ca=ca.pem,
    /// redlock://a:6380,b:6380,c:6380?tls=true&tls_ca=ca.pem,
    /// etcds://h:2379?tls_ca=ca.pem&tls_cert=client.pem&tls_key=client.key,
    /// postgres://u@h/db?tls_ca=ca.pem, mysql://u@h/db?tls_ca=ca.pem (`lockctl run --help`
    /// has an example per store)
    #[arg(long, env = "LOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// How long to try to reach the store before giving up (exit 69).
    #[arg(long, global = true, default_value = "10s", value_parser = duration::parse)]
    connect_timeout: Duration,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire KEY (alone, --shared, or one of --permits N), run CMD while keeping the lease
    /// alive, release when it ends.
    #[command(after_help = RUN_AFTER_HELP)]
    Run {
        /// The lock's key.
        key: String,
        /// The lease TTL; the lease is extended at a third of it while CMD runs.
        #[arg(long, default_value = "30s", value_parser = duration::parse)]
        ttl: Duration,
        /// Wait up to this long for the lock (default, or 0: one attempt).
        #[arg(long, value_parser = duration::parse_wait)]
        wait: Option<Duration>,
        /// Take one of N permits of KEY (a semaphore: at most N holders at once) instead of
        /// the lock itself; CMD gets its slot, 0 to N-1, in LOCK_SLOT. Every holder of the key
        /// must give the same N.
        #[arg(
            long,
            value_name = "N",
            conflicts_with = "shared",
            value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PERMITS))
        )]
        permits: Option<u32>,
        /// Hold KEY shared, as a reader: readers run together, and exclude the holders of KEY
        /// without --shared (writers). A waiting writer keeps new readers out.
        #[arg(long)]
        shared: bool,
        /// After SIGTERM to CMD's process group (on a lost lease, or to what CMD left behind
        /// when it exited), how long the group gets before SIGKILL.
        #[arg(long, default_value = "10s", value_parser = duration::parse)]
        grace: Duration,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<OsString>,
    },
    /// Show whether KEY is held, its fencing token and remaining TTL; for a key held shared or
    /// as permits, how many hold it and each holder's slot, token and remaining TTL.
    Status {
        /// The lock's key.
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show how much per-key state the store holds (Redis keys, PostgreSQL fence rows) and for
    /// how long it keeps it.
    Stats {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the conformance suite against the store and print a table of cases.
    Conformance {
        /// How many cases run at once.
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        /// Run only the cases whose name contains this text (repeatable; default: every case).
        #[arg(long = "case", value_name = "TEXT")]
        cases: Vec<String>,
    },
    /// Measure cycle, throughput and handoff against the store's raw round trip.
    Bench {
        /// Cycles to time.
        #[arg(long, default_value_t = 2000)]
        iterations: usize,
    },
}

/// Whether this build has TLS, for the help.
#[cfg(feature = "tls")]
macro_rules! tls_build {
    () => {
        "this lockctl has TLS"
    };
}
#[cfg(not(feature = "tls"))]
macro_rules! tls_build {
    () => {
        "this lockctl has no TLS: build it with --features tls"
    };
}

/// The end of `lockctl run --help`: a TLS URL per store, the examples of the TLS table in docs/security.md.
const RUN_AFTER_HELP: &str = concat!(
    "CMD's environment: LOCK_KEY (the key), LOCK_FENCING_TOKEN (the lease's fencing token),\n",
    "LOCK_MODE (exclusive, shared or permit); with --permits N also LOCK_PERMITS (N) and\n",
    "LOCK_SLOT (the permit's slot, 0 to N-1: a resource the permit holders share fences per\n",
    "slot, whose tokens only grow). A store that does not keep --shared or --permits refuses\n",
    "them (exit 64); so does a key whose permits are held with another N.\n",
    "\n",
    "TLS URLs, one per store (",
    tls_build!(),
    "); on every store tls_ca, tls_cert and tls_key name PEM files:\n",
    "  Redis       rediss://:PASSWORD@redis.internal:6380/0?tls_ca=/etc/fencelock/ca.pem\n",
    "  Redlock     redlock://a:6380,b:6380,c:6380?tls=true&tls_ca=/etc/fencelock/ca.pem\n",
    "  etcd        etcds://etcd1:2379,etcd2:2379?tls_ca=/etc/fencelock/ca.pem&tls_cert=/etc/fencelock/client.pem&tls_key=/etc/fencelock/client.key\n",
    "  PostgreSQL  postgres://locks@pg.internal/app?tls_ca=/etc/fencelock/ca.pem\n",
    "  MySQL       mysql://locks@db.internal/app?tls_ca=/etc/fencelock/ca.pem\n",
    "On PostgreSQL and MySQL tls_ca implies sslmode=verify-full unless sslmode is given.\n",
    "Give a URL with a password in LOCK_URL, not --url: a command line is visible to every user\n",
    "of the host, e.g.\n",
    "  LOCK_URL='rediss://:PASSWORD@redis.internal:6380/0?tls_ca=/etc/fencelock/ca.pem' \\\n",
    "    lockctl run nightly-export --ttl 30s -- ./export.sh",
);

/// sysexits.h
pub(crate) mod exit {
    pub const USAGE: u8 = 64;
    pub const UNAVAILABLE: u8 = 69;
    pub const SOFTWARE: u8 = 70;
    pub const TEMPFAIL: u8 = 75;
    pub const PROTOCOL: u8 = 76;
}

/// The exit code for an error that ends `lockctl`.
pub(crate) fn exit_code(error: &Error) -> u8 {
    match error.kind() {
        // A mode the store does not keep, or permits of another limit than the key's holders
        // use, never succeed by retrying the same command line (69 and 75 invite retries):
        // the command line or the URL must change.
        ErrorKind::InvalidInput | ErrorKind::Unsupported => exit::USAGE,
        ErrorKind::Contended => exit::TEMPFAIL,
        ErrorKind::Unavailable => exit::UNAVAILABLE,
        ErrorKind::LeaseLost | ErrorKind::StaleToken => exit::SOFTWARE,
        ErrorKind::Store => exit::PROTOCOL,
        _ => exit::SOFTWARE,
    }
}

pub(crate) fn fail(error: &Error) -> ExitCode {
    eprintln!("lockctl: {}", usage::one_line(&error.to_string()));
    ExitCode::from(exit_code(error))
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version: clap's own text on stdout, exit 0.
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        // Every refusal is one line.
        Err(error) => {
            let command = <Cli as clap::CommandFactory>::command();
            let subcommands: Vec<&str> = command
                .get_subcommands()
                .map(clap::Command::get_name)
                .collect();
            eprintln!("lockctl: {}", usage::argument_error(error, &subcommands));
            return ExitCode::from(exit::USAGE);
        }
    };
    // The guardian is forked now, while lockctl still has one thread (see guardian.rs).
    let guardian = match &cli.command {
        // SAFETY: no thread has been started yet: the runtime is built below.
        Command::Run { .. } => match unsafe { guardian::Guardian::start() } {
            Ok(guardian) => Some(guardian),
            Err(error) => {
                eprintln!("lockctl: cannot start the guardian process: {error}");
                return ExitCode::from(exit::SOFTWARE);
            }
        },
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lockctl: cannot start the async runtime: {error}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    runtime.block_on(async move {
        let Some(url) = cli.url.clone() else {
            eprintln!("lockctl: no store given: pass --url URL or set LOCK_URL");
            return ExitCode::from(exit::USAGE);
        };
        match cli.command {
            Command::Conformance {
                parallel,
                ref cases,
            } => return check::conformance(&url, parallel, cases).await,
            Command::Bench { iterations } => {
                let store = match connect(&url, cli.connect_timeout).await {
                    Ok(store) => store,
                    Err(error) => return fail(&error),
                };
                return bench::bench(&url, store, iterations).await;
            }
            _ => {}
        }
        let store = match connect(&url, cli.connect_timeout).await {
            Ok(store) => store,
            Err(error) => return fail(&error),
        };
        match cli.command {
            Command::Run {
                key,
                ttl,
                wait,
                permits,
                shared,
                grace,
                command,
            } => match guardian {
                Some(guardian) => {
                    let mode = match (permits, shared) {
                        (Some(limit), _) => Mode::permits(limit),
                        (None, true) => Mode::Shared,
                        (None, false) => Mode::Exclusive,
                    };
                    let request = run::Request {
                        key: &key,
                        ttl,
                        wait,
                        mode,
                        grace,
                    };
                    run::run(store, request, command, guardian).await
                }
                None => unreachable!("the guardian is started for run"),
            },
            Command::Status { key, json } => status::status(store, &key, json).await,
            Command::Stats { json } => stats::stats(store, json).await,
            Command::Conformance { .. } | Command::Bench { .. } => unreachable!("handled above"),
        }
    })
}

/// Connects within `limit`, so an unreachable store is exit 69, never a hang.
pub(crate) async fn connect(url: &str, limit: Duration) -> Result<DynLockStore, Error> {
    match tokio::time::timeout(limit, fencelock::connect(url)).await {
        Ok(result) => result,
        Err(_) => Err(Error::Unavailable {
            message: format!("no answer from {} within {limit:?}", fencelock::redact(url)),
            source: None,
        }),
    }
}
