//! The worker pool: starts workers (processes, or tasks for an in-process store), follows
//! each one's progress from the history, and pauses, cuts off or kills one for a fault.

// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use fencelock::{CancellationToken, DynLockStore, Result};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use test_servers::{ClockControl, FreezableRelay};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use crate::clock::now_ns;
use crate::fault::Target;
use crate::history::{Entry, Event, Recorder, WorkMode};
use crate::servers::setup_error;
use crate::store::Link;
use crate::worker::{self, Emit, WorkerConfig};

/// A worker's progress, as the controller follows it from the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between a release (or a failed wait) and the next acquire.
    Idle,
    Waiting,
    Granted,
    /// Claimed the fenced row: inside its read-modify-write.
    Working,
}

enum Handle {
    Process {
        child: Child,
        stdin: Option<ChildStdin>,
        relays: Vec<FreezableRelay>,
        reader: Option<JoinHandle<()>>,
        /// The worker's own wall clock (the clock shim), for worker-clock-back and -forward.
        clock: ClockControl,
    },
    Task {
        task: tokio::task::JoinHandle<()>,
        link: Link,
        gate: watch::Sender<bool>,
        stop: CancellationToken,
    },
}

/// The live workers of one store run.
pub(crate) struct Pool<'rt> {
    /// The controller's runtime: in-process workers run on it, and faults that talk to a
    /// server use it.
    pub(crate) runtime: &'rt Runtime,
    recorder: Recorder,
    store_url: String,
    /// Whether process workers reach the store through relays (not SQLite: a file).
    relayed: bool,
    /// The store of in-process workers.
    shared: Option<DynLockStore>,
    template: WorkerConfig,
    /// The modes new workers take, in turn.
    modes: Vec<WorkMode>,
    /// Each worker's mode, so a replacement takes it.
    pub(crate) mode_of: HashMap<u32, WorkMode>,
    binary: PathBuf,
    workers: BTreeMap<u32, Handle>,
    next_id: u32,
    scanned: usize,
    phase: HashMap<u32, Phase>,
}

impl<'rt> Pool<'rt> {
    /// A pool without workers: process workers run `binary` against `store_url` (through
    /// relays when `relayed`), task workers share `shared`; `template` is every worker's
    /// config but its id and mode, which come from `modes` in turn.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        runtime: &'rt Runtime,
        recorder: Recorder,
        store_url: String,
        relayed: bool,
        shared: Option<DynLockStore>,
        template: WorkerConfig,
        modes: Vec<WorkMode>,
        binary: PathBuf,
    ) -> Self {
        Pool {
            runtime,
            recorder,
            store_url,
            relayed,
            shared,
            template,
            modes,
            mode_of: HashMap::new(),
            binary,
            workers: BTreeMap::new(),
            next_id: 1,
            scanned: 0,
            phase: HashMap::new(),
        }
    }

    /// Starts a worker in `mode`, or in the next mode of the mix.
    pub(crate) fn spawn(&mut self, mode: Option<WorkMode>) -> Result<u32> {
        let id = self.next_id;
        self.next_id += 1;
        let mode = mode.unwrap_or_else(|| {
            let i = (id as usize - 1) % self.modes.len().max(1);
            self.modes.get(i).copied().unwrap_or_default()
        });
        self.mode_of.insert(id, mode);
        let config = WorkerConfig {
            id,
            mode,
            ..self.template.clone()
        };
        let handle = match &self.shared {
            Some(store) => {
                let link = Link::new(store.clone());
                let gate = watch::Sender::new(true);
                let stop = CancellationToken::new();
                let recorder = self.recorder.clone();
                let emit: Emit = Arc::new(move |e| recorder.push(e));
                let task = self.runtime.spawn(worker::run(
                    Arc::new(link.clone()),
                    config,
                    emit,
                    stop.clone(),
                    Some(gate.subscribe()),
                ));
                Handle::Task {
                    task,
                    link,
                    gate,
                    stop,
                }
            }
            None => self.spawn_process(config)?,
        };
        self.workers.insert(id, handle);
        Ok(id)
    }

    fn spawn_process(&self, config: WorkerConfig) -> Result<Handle> {
        let (relays, url) = if self.relayed {
            let (prefix, hosts, tail) = split_hosts(&self.store_url);
            let relays = hosts
                .iter()
                .map(|h| FreezableRelay::start(h).map_err(setup_error))
                .collect::<Result<Vec<_>>>()?;
            let url = format!(
                "{prefix}{}{tail}",
                relays
                    .iter()
                    .map(FreezableRelay::address)
                    .collect::<Vec<_>>()
                    .join(",")
            );
            (relays, url)
        } else {
            (Vec::new(), self.store_url.clone())
        };
        let mut cmd = Command::new(&self.binary);
        cmd.arg("worker")
            .args(["--id", &config.id.to_string()])
            .args(["--store-url", &url])
            .args(["--resource-url", &config.resource_url])
            .args(["--schema", &config.schema])
            .args(["--ttl-ms", &config.ttl.as_millis().to_string()])
            .args(["--hold-ms", &config.hold_max.as_millis().to_string()])
            .args(["--mode", &config.mode.arg()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; a worker must not outlive the controller.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                Ok(())
            });
        }
        let clock = ClockControl::new().map_err(setup_error)?;
        clock.apply(&mut cmd).map_err(setup_error)?;
        let mut child = cmd.spawn().map_err(setup_error)?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| setup_error("worker without stdout"))?;
        let recorder = self.recorder.clone();
        let id = config.id;
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Entry>(&line) {
                    Ok(entry) => recorder.push(entry),
                    Err(e) => recorder.push(Entry {
                        t: now_ns(),
                        worker: id,
                        event: Event::Error {
                            what: format!("unreadable line {line:?}: {e}"),
                        },
                    }),
                }
            }
        });
        Ok(Handle::Process {
            child,
            stdin,
            relays,
            reader: Some(reader),
            clock,
        })
    }

    /// Follows the history recorded since the last call.
    fn follow(&mut self) {
        let (scanned, phase) = (&mut self.scanned, &mut self.phase);
        self.recorder.with(|entries| {
            for e in &entries[*scanned..] {
                let next = match &e.event {
                    Event::Acquire { .. } => Phase::Waiting,
                    Event::Grant { .. } => Phase::Granted,
                    Event::Read { row, .. } if row.is_fenced() => Phase::Working,
                    Event::Release { .. } | Event::AcquireFailed { .. } => Phase::Idle,
                    _ => continue,
                };
                phase.insert(e.worker, next);
            }
            *scanned = entries.len();
        });
    }

    /// The live workers in `phase`, in id order.
    fn in_phase(&self, phase: Phase) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .phase
            .iter()
            .filter(|(id, p)| **p == phase && self.workers.contains_key(id))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// A live worker for a fault aimed at `target`: for [`Target::Any`], a holder (preferably
    /// inside its read-modify-write) or a waiter, each half the time when both exist.
    fn pick(&mut self, target: Target, rng: &mut StdRng) -> Option<u32> {
        self.follow();
        let waiting = self.in_phase(Phase::Waiting);
        let working = self.in_phase(Phase::Working);
        let holding = if working.is_empty() {
            self.in_phase(Phase::Granted)
        } else {
            working
        };
        let from = match target {
            Target::Waiter => waiting,
            Target::Any if holding.is_empty() => waiting,
            Target::Any if waiting.is_empty() || rng.random_bool(0.5) => holding,
            Target::Any => waiting,
        };
        from.choose(rng).copied()
    }

    /// A live worker for a fault aimed at `target`, waiting `within` for one to appear.
    pub(crate) fn wait_for_target(
        &mut self,
        target: Target,
        within: Duration,
        rng: &mut StdRng,
    ) -> Option<u32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(id) = self.pick(target, rng) {
                return Some(id);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, id: u32, sig: libc::c_int) {
        if let Some(Handle::Process { child, .. }) = self.workers.get(&id) {
            // SAFETY: plain system call on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }

    /// Stops (`true`) or resumes (`false`) a worker as a whole.
    pub(crate) fn pause(&self, id: u32, paused: bool) {
        match self.workers.get(&id) {
            Some(Handle::Process { .. }) => {
                self.signal(id, if paused { libc::SIGSTOP } else { libc::SIGCONT })
            }
            Some(Handle::Task { link, gate, .. }) => {
                // Link first on pause (the keep-alive stalls at once), gate first on resume.
                if paused {
                    link.cut(true);
                    gate.send_replace(false);
                } else {
                    gate.send_replace(true);
                    link.cut(false);
                }
            }
            None => {}
        }
    }

    /// Cuts (`true`) or restores a worker's way to the store: all of it, or the relays to
    /// the nodes `only` lists.
    pub(crate) fn cut(&self, id: u32, cut: bool, only: Option<&[usize]>) {
        match self.workers.get(&id) {
            Some(Handle::Process { relays, .. }) => {
                for (i, relay) in relays.iter().enumerate() {
                    if only.is_none_or(|o| o.contains(&i)) {
                        relay.freeze(cut);
                    }
                }
            }
            Some(Handle::Task { link, .. }) => link.cut(cut),
            None => {}
        }
    }

    /// Steps a worker process's wall clock by `micros` more; `false` for a task worker (its
    /// clock is the controller's) or a worker gone.
    pub(crate) fn step_clock(&self, id: u32, micros: i64) -> test_servers::Result<bool> {
        match self.workers.get(&id) {
            Some(Handle::Process { clock, .. }) => clock.step_micros(micros).map(|()| true),
            _ => Ok(false),
        }
    }

    /// Kills a worker and forgets it.
    pub(crate) fn kill(&mut self, id: u32) {
        match self.workers.remove(&id) {
            Some(Handle::Process {
                mut child, reader, ..
            }) => {
                let _ = child.kill();
                let _ = child.wait();
                if let Some(reader) = reader {
                    let _ = reader.join();
                }
            }
            Some(Handle::Task { task, .. }) => {
                task.abort();
                let _ = self.runtime.block_on(task);
            }
            None => {}
        }
    }

    /// Asks every worker to stop after its current round, then kills what is left.
    pub(crate) fn stop_all(&mut self, ttl: Duration) {
        let ids: Vec<u32> = self.workers.keys().copied().collect();
        for id in &ids {
            self.pause(*id, false);
            self.cut(*id, false, None);
        }
        for handle in self.workers.values_mut() {
            match handle {
                Handle::Process { stdin, .. } => drop(stdin.take()),
                Handle::Task { stop, .. } => stop.cancel(),
            }
        }
        let deadline = Instant::now() + ttl * 4 + Duration::from_secs(10);
        for (_, handle) in std::mem::take(&mut self.workers) {
            match handle {
                Handle::Process {
                    mut child, reader, ..
                } => {
                    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                        thread::sleep(Duration::from_millis(10));
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    if let Some(reader) = reader {
                        let _ = reader.join();
                    }
                }
                Handle::Task { task, .. } => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.runtime.block_on(async {
                        let abort = task.abort_handle();
                        if tokio::time::timeout(left, task).await.is_err() {
                            abort.abort();
                        }
                    });
                }
            }
        }
    }
}

/// `scheme://[user@]` , the host list, and the rest of a URL.
fn split_hosts(url: &str) -> (String, Vec<String>, String) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (String::new(), Vec::new(), url.to_string());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let hosts = hosts.split(',').map(str::to_string).collect();
    (format!("{scheme}://{user}"), hosts, tail.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_split_from_the_rest_of_the_url() {
        assert_eq!(
            split_hosts("redlock://u:p@a:1,b:2/0?prefix=x"),
            (
                "redlock://u:p@".to_string(),
                vec!["a:1".to_string(), "b:2".to_string()],
                "/0?prefix=x".to_string()
            )
        );
        assert_eq!(
            split_hosts("postgres://postgres@127.0.0.1:5/postgres"),
            (
                "postgres://postgres@".to_string(),
                vec!["127.0.0.1:5".to_string()],
                "/postgres".to_string()
            )
        );
    }
}
