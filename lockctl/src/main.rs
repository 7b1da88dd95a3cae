//! `lockctl`: lock a command from the shell on any fencelock store.
//!
//! ```text
//! LOCK_URL=… lockctl run nightly-export --ttl 30s -- ./export.sh
//! ```
//!
//! `lockctl --help` lists an example URL of every store this build has.
//!
//! Exit codes follow sysexits: the command's own code when it ran; 64 bad input (including a
//! lock mode the store does not keep, and `--permits` disagreeing with the limit the key's
//! permits are held with); 69 store unreachable; 70 lease lost while the command ran (its
//! process group is terminated), or expired before it could start (it never ran); 75 the lock is held by someone else (and the wait, if any, ran
//! out); 76 the store answered with an error. `lockctl leader` exits 1 when nobody leads.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use fencelock::{limits::MAX_PERMITS, DynLockStore, Error, ErrorKind, LockStoreExt, Mode};

mod bench;
mod check;
mod duration;
mod group;
mod guardian;
mod leader;
mod list;
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
    /// The store's URL; its help, an example per store, is written at run time (`url_help`).
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
    Run {
        /// The lock's key; several keys are taken together, every one or none, in the order
        /// of their bytes (CMD gets the first in LOCK_KEY_0 and its token in
        /// LOCK_FENCING_TOKEN_0, the second in LOCK_KEY_1 and LOCK_FENCING_TOKEN_1, and so on).
        #[arg(required = true, num_args = 1.., value_name = "KEY")]
        keys: Vec<String>,
        /// The lease TTL; the lease is extended every quarter of it while CMD runs.
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
        /// The holder's label, which `lockctl status` shows (default: `<host> pid <pid>`).
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<OsString>,
    },
    /// Campaign to lead the election NAME, run CMD while leading (its term in
    /// LOCK_FENCING_TOKEN, the value in LOCK_LEADER_VALUE), end its process group once
    /// leadership is lost (exit 70), resign when it exits.
    Elect {
        /// The election's name (the key its leader holds).
        name: String,
        /// The leader's value, which `lockctl leader` prints (default: `<host> pid <pid>`).
        #[arg(long, value_name = "V")]
        value: Option<String>,
        /// The leader's lease TTL: how long the election stays led by a leader that stopped;
        /// extended at a quarter of it while CMD runs.
        #[arg(long, default_value = "30s", value_parser = duration::parse)]
        ttl: Duration,
        /// Give up campaigning after this long (exit 75; default: campaign until leading).
        #[arg(long, value_parser = duration::parse_wait)]
        wait: Option<Duration>,
        /// After SIGTERM to CMD's process group, how long the group gets before SIGKILL.
        #[arg(long, default_value = "10s", value_parser = duration::parse)]
        grace: Duration,
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<OsString>,
    },
    /// Show the leader of the election NAME (value, term, time left), or "no leader" (exit 1).
    Leader {
        /// The election's name.
        name: String,
        /// Print a line per change (a new leader, a proclaimed value, no leader) until
        /// interrupted.
        #[arg(long)]
        watch: bool,
        /// Print JSON, one object per line.
        #[arg(long)]
        json: bool,
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
    /// List the keys held under PREFIX (every held key without one), one line each: key,
    /// mode, holders, token, time left, label; in byte order.
    Ls {
        /// Only keys that start with this.
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON lines, one object per key (as `status --json`).
        #[arg(long)]
        json: bool,
        /// Print at most N keys.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
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

/// `value` as one line of JSON (what `--json` prints): the facade's types serialized.
pub(crate) fn to_json_line(value: &impl serde::Serialize) -> String {
    // Only maps with string keys and plain values: serializing cannot fail.
    serde_json::to_string(value)
        .unwrap_or_else(|error| format!("{{\"error\":\"cannot print as JSON: {error}\"}}"))
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

/// The command line with the help that lists the stores: written at run time from the facade's
/// list of the stores this build has, so it never names a store of its own.
fn command() -> clap::Command {
    let (short, long) = url_help();
    <Cli as clap::CommandFactory>::command()
        .mut_arg("url", |url| url.help(short).long_help(long))
        // Not mut_subcommand, which moves the subcommand to the end of the list.
        .mut_subcommands(|sub| match sub.get_name() {
            "run" => sub.after_help(run_after_help()),
            "elect" => sub.after_help(ELECT_AFTER_HELP),
            _ => sub,
        })
}

/// `--url`'s help: an example URL per store, and in the long help a TLS URL per store.
fn url_help() -> (String, String) {
    let examples: Vec<&str> = fencelock::STORES
        .iter()
        .map(|kind| kind.example)
        .filter(|example| !example.is_empty())
        .collect();
    let short = format!("The store, e.g. {}", examples.join(", "));
    let tls: Vec<&str> = tls_examples().map(|(_, example)| example).collect();
    let long = if tls.is_empty() {
        short.clone()
    } else {
        format!(
            "{short}\n\nTLS (in a build with `--features tls`): {} (`lockctl run --help` has an \
             example per store)",
            tls.join(", ")
        )
    };
    (short, long)
}

/// Each store's name and TLS example URL, for the stores that have TLS.
fn tls_examples() -> impl Iterator<Item = (&'static str, &'static str)> {
    fencelock::STORES
        .iter()
        .filter(|kind| !kind.tls_example.is_empty())
        .map(|kind| (kind.name, kind.tls_example))
}

/// The end of `lockctl run --help`: CMD's environment, and a TLS URL per store (the examples
/// of the TLS table in docs/security.md).
fn run_after_help() -> String {
    let mut help = String::from(concat!(
        "CMD's environment: LOCK_KEY (the key), LOCK_FENCING_TOKEN (the lease's fencing token),\n",
        "LOCK_MODE (exclusive, shared or permit); with --permits N also LOCK_PERMITS (N) and\n",
        "LOCK_SLOT (the permit's slot, 0 to N-1: a resource the permit holders share fences per\n",
        "slot, whose tokens only grow). A store that does not keep --shared or --permits refuses\n",
        "them (exit 64); so does a key whose permits are held with another N.\n",
    ));
    let Some((_, first)) = tls_examples().next() else {
        return help;
    };
    help.push_str(concat!(
        "\nTLS URLs, one per store (",
        tls_build!(),
        "); on every store tls_ca, tls_cert and tls_key name PEM files:\n",
    ));
    let width = tls_examples()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(0)
        + 2;
    for (name, example) in tls_examples() {
        help.push_str(&format!("  {name:width$}{example}\n"));
    }
    help.push_str(concat!(
        "Give a URL with a password in LOCK_URL, not --url: a command line is visible to every user\n",
        "of the host, e.g.\n",
    ));
    help.push_str(&format!(
        "  LOCK_URL='{first}' \\\n    lockctl run nightly-export --ttl 30s -- ./export.sh"
    ));
    help
}

/// The end of `lockctl elect --help`.
const ELECT_AFTER_HELP: &str = concat!(
    "CMD's environment: LOCK_KEY (the election's name), LOCK_FENCING_TOKEN (the term: greater\n",
    "than every earlier term of the election; pass it with every write), LOCK_LEADER_VALUE (the\n",
    "value), LOCK_MODE (exclusive). Exit codes as `lockctl run`: CMD's own when it ran, 70 when\n",
    "leadership was lost while it ran (its process group is terminated), 75 when --wait ran out."
);

/// sysexits.h
pub(crate) mod exit {
    pub(crate) const USAGE: u8 = 64;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const SOFTWARE: u8 = 70;
    pub(crate) const TEMPFAIL: u8 = 75;
    pub(crate) const PROTOCOL: u8 = 76;
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
    let parsed = command()
        .try_get_matches()
        .and_then(|matches| <Cli as clap::FromArgMatches>::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        // --help and --version: clap's own text on stdout, exit 0.
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        // Every refusal is one line.
        Err(error) => {
            let command = command();
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
        Command::Run { .. } | Command::Elect { .. } => match unsafe { guardian::Guardian::start() }
        {
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
                keys,
                ttl,
                wait,
                permits,
                shared,
                grace,
                label,
                command,
            } => match guardian {
                Some(guardian) => {
                    let mode = match (permits, shared) {
                        (Some(limit), _) => Mode::permits(limit),
                        (None, true) => Mode::Shared,
                        (None, false) => Mode::Exclusive,
                    };
                    let label = label.unwrap_or_else(run::default_label);
                    let request = run::Request {
                        keys: &keys,
                        ttl,
                        wait,
                        mode,
                        grace,
                        label: &label,
                        elect: false,
                    };
                    run::run(store, request, command, guardian).await
                }
                None => unreachable!("the guardian is started for run"),
            },
            Command::Elect {
                name,
                value,
                ttl,
                wait,
                grace,
                command,
            } => match guardian {
                Some(guardian) => {
                    let value = value.unwrap_or_else(run::default_label);
                    // The name and value are checked as an election checks them, so a bad one
                    // is named as such.
                    if let Err(error) = store.election(&name).check(&value) {
                        guardian.stand_down();
                        return fail(&error);
                    }
                    let request = run::Request {
                        keys: std::slice::from_ref(&name),
                        ttl,
                        wait,
                        mode: Mode::Exclusive,
                        grace,
                        label: &value,
                        elect: true,
                    };
                    run::run(store, request, command, guardian).await
                }
                None => unreachable!("the guardian is started for elect"),
            },
            Command::Leader { name, watch, json } => {
                leader::leader(store, &name, watch, json).await
            }
            Command::Status { key, json } => status::status(store, &key, json).await,
            Command::Ls {
                prefix,
                json,
                limit,
            } => {
                let limit = limit.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
                list::list(store, &prefix, json, limit).await
            }
            Command::Stats { json } => stats::stats(store, &url, json).await,
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
