//! The fault injector: injects one fault at a time into the store's servers or a worker of
//! the pool, records its start and its healing in the history, and heals it.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::Result;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use test_servers::zookeeper::{INIT_LIMIT_TICKS, TICK};
use test_servers::EtcdCluster;

use crate::clock::now_ns;
use crate::delays::StoreDelays;
use crate::fault::Fault;
use crate::faults;
use crate::history::{Entry, Event, Recorder};
use crate::pool::Pool;
use crate::servers::{setup_error, Servers};
use crate::store::RestartingMemory;
use crate::worker;

/// Ends the holders' sessions on the PostgreSQL lock store, as an operator would; one
/// statement, so the holders found are the ones terminated.
const TERMINATE_HOLDERS_SQL: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
     WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()";

/// How long a ZooKeeper follower cut off from the quorum may take to serve again once mended:
/// a join begun through the cut goes on at the mend or gives up after `initLimit`, and the
/// next join takes at most as long.
const REJOIN_TIMEOUT: Duration = TICK.saturating_mul(2 * INIT_LIMIT_TICKS);

/// How often the injector asks a ZooKeeper member whether it serves (one `srvr` exchange).
const SERVING_POLL: Duration = Duration::from_millis(20);

/// The MySQL lock store's holder of a lock name: its session's connection id (NULL if free).
/// Not atomic with the `KILL` that follows, and need not be: the fault's window in the history
/// spans both statements, so whoever holds the lock in between is covered by rule 3's excuse.
const MYSQL_HOLDER_SQL: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)";

/// The nemesis of one store run: its seeded RNG and the faults it injected.
pub(crate) struct Nemesis {
    /// Seeded: picks the gaps, the order of the faults, their targets and their lengths.
    pub(crate) rng: StdRng,
    ttl: Duration,
    delays: &'static StoreDelays,
    recorder: Recorder,
    next_fault: u32,
    /// The names of the faults injected, in order.
    pub(crate) injected: Vec<String>,
}

impl Nemesis {
    /// A nemesis that has injected nothing yet, for workers asking for `ttl` on a store with
    /// `delays`, recording into `recorder`.
    pub(crate) fn new(
        rng: StdRng,
        ttl: Duration,
        delays: &'static StoreDelays,
        recorder: Recorder,
    ) -> Self {
        Nemesis {
            rng,
            ttl,
            delays,
            recorder,
            next_fault: 1,
            injected: Vec::new(),
        }
    }

    /// How far a clock fault steps its clock, µs: a server's back by up to
    /// [`crate::fault::CLOCK_BACK_MAX`] (a quarter of the TTL at most) and forward by at most
    /// half the lease's drift margin; a worker's by 1–3 s either way.
    fn clock_step(&mut self, fault: Fault) -> i64 {
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let back = micros(crate::fault::CLOCK_BACK_MAX.min(self.ttl / 4));
        let forward = micros(fencelock::raw::drift(self.ttl) / 2);
        let worker = self.rng.random_range(1_000_000..=3_000_000);
        match fault {
            Fault::ClockBack => -self.rng.random_range(1..=back.max(1)),
            Fault::ClockForward => self.rng.random_range(1..=forward.max(1)),
            Fault::WorkerClockBack => -worker,
            _ => worker,
        }
    }

    /// Longer than the TTL, so the lock is taken over meanwhile.
    fn past_ttl(&mut self) -> Duration {
        self.ttl.mul_f64(self.rng.random_range(1.5..2.5))
    }

    fn record(&mut self, fault: Fault, target: Option<u32>, detail: &str) -> u32 {
        self.record_as(fault, target, detail, fault.frees_early())
    }

    /// Records a fault whose early freeing depends on the moment (which member led).
    fn record_as(
        &mut self,
        fault: Fault,
        target: Option<u32>,
        detail: &str,
        frees_early: bool,
    ) -> u32 {
        let id = self.next_fault;
        self.next_fault += 1;
        self.recorder.push(Entry {
            t: now_ns(),
            worker: 0,
            event: Event::Fault {
                id,
                kind: fault.name().to_string(),
                target,
                frees_early,
                detail: detail.to_string(),
            },
        });
        self.injected.push(fault.name().to_string());
        id
    }

    fn healed(&self, id: u32) {
        self.recorder.push(Entry {
            t: now_ns(),
            worker: 0,
            event: Event::Healed { id },
        });
    }

    /// Injects `fault` and heals it; `None` if it needed a holder and there was none.
    pub(crate) fn inject(
        &mut self,
        fault: Fault,
        pool: &mut Pool<'_>,
        servers: &mut Servers,
        restarting: Option<&RestartingMemory>,
    ) -> Result<Option<String>> {
        let holder = match fault.target() {
            Some(target) => {
                let within = self.ttl * 3 + Duration::from_secs(2);
                match pool.wait_for_target(target, within, &mut self.rng) {
                    Some(id) => Some(id),
                    None => return Ok(None),
                }
            }
            None => None,
        };
        let fail = |e: test_servers::Error| setup_error(format!("{fault}: {e}"));
        let detail = match (fault, &mut *servers) {
            (Fault::Pause, _) => {
                let (w, pause) = (holder.unwrap_or(0), self.past_ttl());
                let id = self.record(fault, holder, &format!("worker {w} for {pause:?}"));
                pool.pause(w, true);
                thread::sleep(pause);
                pool.pause(w, false);
                self.healed(id);
                format!("worker {w} paused for {pause:?}")
            }
            (Fault::PauseWaiter, _) => {
                // Past rule 4's bound, so a waiter that keeps the key while frozen is seen.
                let w = holder.unwrap_or(0);
                let pause =
                    self.delays.bound(self.ttl) + self.ttl.mul_f64(self.rng.random_range(0.5..1.5));
                let id = self.record(fault, holder, &format!("waiting worker {w} for {pause:?}"));
                pool.pause(w, true);
                thread::sleep(pause);
                pool.pause(w, false);
                self.healed(id);
                format!("waiting worker {w} paused for {pause:?}")
            }
            (Fault::Kill, _) => {
                let w = holder.unwrap_or(0);
                let id = self.record(fault, holder, &format!("worker {w}"));
                let mode = pool.mode_of.get(&w).copied();
                pool.kill(w);
                let replacement = pool.spawn(mode)?;
                self.healed(id);
                format!("worker {w} killed, worker {replacement} started")
            }
            (Fault::Cut, _) => {
                let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
                let id = self.record(fault, holder, &format!("worker {w} for {cut:?}"));
                pool.cut(w, true, None);
                thread::sleep(cut);
                pool.cut(w, false, None);
                self.healed(id);
                format!("worker {w} cut off for {cut:?}")
            }
            (Fault::RedlockCutMinority, Servers::Redlock(nodes)) => {
                let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
                let mut picked: Vec<usize> = (0..nodes.len()).collect();
                picked.shuffle(&mut self.rng);
                picked.truncate(nodes.len().saturating_sub(1) / 2);
                let what = format!("worker {w} from nodes {picked:?} for {cut:?}");
                let id = self.record(fault, holder, &what);
                pool.cut(w, true, Some(&picked));
                thread::sleep(cut);
                pool.cut(w, false, Some(&picked));
                self.healed(id);
                what
            }
            (Fault::StoreRestart, _) => {
                let store = restarting.ok_or_else(|| setup_error("not a restartable store"))?;
                let id = self.record(fault, None, "memory store restarted");
                store.restart();
                self.healed(id);
                "memory store restarted".to_string()
            }
            (Fault::RedisRestart, Servers::Redis(server)) => {
                let id = self.record(fault, None, "SIGKILL, restart empty");
                // Empty, its clock may come back right: behind, it would mint below the
                // tokens its lost fence keys had reached (the store's docs' failure).
                set_right(server.clock()).map_err(fail)?;
                server.restart().map_err(fail)?;
                self.healed(id);
                "killed and restarted empty".to_string()
            }
            (Fault::RedlockRestartMinority, Servers::Redlock(nodes)) => {
                let mut picked: Vec<usize> = (0..nodes.len()).collect();
                picked.shuffle(&mut self.rng);
                picked.truncate(nodes.len().saturating_sub(1) / 2);
                let down = self.past_ttl();
                let what = format!("nodes {picked:?} killed, restarted empty after {down:?}");
                let id = self.record(fault, None, &what);
                for &i in &picked {
                    nodes[i].kill().map_err(fail)?;
                }
                thread::sleep(down);
                for &i in &picked {
                    set_right(nodes[i].clock()).map_err(fail)?;
                    nodes[i].restart().map_err(fail)?;
                }
                self.healed(id);
                what
            }
            (Fault::EtcdKillLeader, Servers::Etcd(cluster)) => {
                let leader = cluster.leader().map_err(fail)?;
                let down = self.past_ttl();
                let what = format!("leader (member {leader}) killed, restarted after {down:?}");
                let id = self.record(fault, None, &what);
                cluster.kill(leader).map_err(fail)?;
                thread::sleep(down);
                cluster.restart(leader).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::EtcdStopMinority, Servers::Etcd(cluster)) => {
                let member = self.rng.random_range(0..cluster.member_count());
                let stopped = self.past_ttl();
                // A leader stopped past a TTL and resumed revokes leases a newer leader kept
                // alive, on etcd before 3.4.31/3.5.13: an early free the
                // etcd store's docs name, so the checker must not blame the store for it.
                let leader = cluster.leader().ok() == Some(member);
                let affected = EtcdCluster::version()
                    .is_ok_and(|version| faults::etcd_stale_leader_revokes_leases(&version));
                let frees_early = leader && affected;
                let what = format!(
                    "member {member}{} stopped for {stopped:?}",
                    if leader { " (the leader)" } else { "" }
                );
                let id = self.record_as(fault, None, &what, frees_early);
                cluster.pause(member).map_err(fail)?;
                thread::sleep(stopped);
                cluster.resume(member).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::PgTerminate, Servers::Postgres(server)) => {
                // Whoever holds an advisory lock when the statement runs is hit, which may be a
                // holder granted after this line: no single target.
                let id = self.record(fault, None, "pg_terminate_backend of advisory-lock holders");
                let url = server.url();
                let ended = pool.runtime.block_on(async move {
                    use sqlx::Connection;
                    let mut conn = sqlx::PgConnection::connect(&url).await?;
                    sqlx::query_scalar::<_, i64>(TERMINATE_HOLDERS_SQL)
                        .fetch_one(&mut conn)
                        .await
                });
                self.healed(id);
                match ended {
                    Ok(n) => format!("{n} holder session(s) terminated"),
                    Err(e) => format!("terminate failed: {e}"),
                }
            }
            (Fault::PgRestart, Servers::Postgres(server)) => {
                let id = self.record(fault, None, "pg_ctl restart -m fast");
                server.restart().map_err(fail)?;
                self.healed(id);
                "fast restart".to_string()
            }
            (Fault::MysqlKill, Servers::Mysql(server)) => {
                // As with pg-terminate, the session hit is whoever holds the lock when the
                // look-up runs: no single target.
                let id = self.record(fault, None, "KILL CONNECTION of the lock's holder");
                let url = server.url();
                let killed = pool.runtime.block_on(kill_mysql_holder(url));
                self.healed(id);
                match killed {
                    Ok(Some(session)) => format!("holder session {session} killed"),
                    Ok(None) => "no holder at the look-up".to_string(),
                    Err(e) => format!("KILL failed: {e}"),
                }
            }
            (Fault::MysqlRestart, Servers::Mysql(server)) => {
                let id = self.record(fault, None, "mariadbd shutdown and start");
                server.restart().map_err(fail)?;
                self.healed(id);
                "fast restart".to_string()
            }
            (Fault::ZkKillLeader, Servers::Zookeeper(ensemble)) => {
                let leader = ensemble.leader().map_err(fail)?;
                let down = self.past_ttl();
                let what = format!("leader (member {leader}) killed, restarted after {down:?}");
                let id = self.record(fault, None, &what);
                ensemble.kill(leader).map_err(fail)?;
                thread::sleep(down);
                ensemble.restart(leader).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::ZkStopMinority, Servers::Zookeeper(ensemble)) => {
                let member = self.rng.random_range(0..ensemble.member_count());
                let stopped = self.past_ttl();
                let leader = ensemble.leader().ok() == Some(member);
                let what = format!(
                    "member {member}{} stopped for {stopped:?}",
                    if leader { " (the leader)" } else { "" }
                );
                let id = self.record(fault, None, &what);
                ensemble.pause(member).map_err(fail)?;
                thread::sleep(stopped);
                ensemble.resume(member).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::ZkIsolateFollower, Servers::Zookeeper(ensemble)) => {
                let leader = ensemble.leader().map_err(fail)?;
                let followers: Vec<usize> = (0..ensemble.member_count())
                    .filter(|&m| m != leader)
                    .collect();
                // Preferably one the workers' lease sessions are on (their TTL names them):
                // sessions leave a cut follower and stay where they land, so a blind pick soon
                // hits no one.
                let with_sessions =
                    ensemble.members_serving_timeout(self.delays.granted_ttl(self.ttl));
                let busy: Vec<usize> = followers
                    .iter()
                    .copied()
                    .filter(|m| with_sessions.contains(m))
                    .collect();
                let from = if busy.is_empty() { &followers } else { &busy };
                let member = from[self.rng.random_range(0..from.len())];
                let cut = self.past_ttl();
                let sessions = if busy.contains(&member) {
                    "workers' sessions on it"
                } else {
                    "no worker's session on it"
                };
                let what = format!(
                    "follower (member {member}, {sessions}) cut off from the quorum for {cut:?}, \
                     its clients connected"
                );
                let id = self.record(fault, None, &what);
                ensemble.isolate(member, true).map_err(fail)?;
                // Watched, so the report says whether it dropped its clients (after syncLimit).
                let start = Instant::now();
                let mut stopped = None;
                while start.elapsed() < cut {
                    if stopped.is_none() && !ensemble.is_serving(member) {
                        stopped = Some(start.elapsed());
                    }
                    thread::sleep(SERVING_POLL.min(cut.saturating_sub(start.elapsed())));
                }
                ensemble.isolate(member, false).map_err(fail)?;
                // Healed once it serves again, so the next fault finds the whole ensemble.
                let mended = Instant::now();
                let mut serving = ensemble.is_serving(member);
                while !serving && mended.elapsed() < REJOIN_TIMEOUT {
                    thread::sleep(SERVING_POLL);
                    serving = ensemble.is_serving(member);
                }
                self.healed(id);
                let stopped = match stopped {
                    Some(after) => format!("it stopped serving them after {after:.2?}"),
                    None => "it served them throughout".to_string(),
                };
                let rejoined = if serving {
                    format!("served again {:.2?} after the mend", mended.elapsed())
                } else {
                    format!("not serving {REJOIN_TIMEOUT:?} after the mend")
                };
                format!("{what}; {stopped}, {rejoined}")
            }
            (Fault::ClockBack | Fault::ClockForward, servers) => {
                let (clock, which) = match servers {
                    Servers::Redis(server) => (server.clock(), "the server".to_string()),
                    Servers::Redlock(nodes) => {
                        let i = self.rng.random_range(0..nodes.len());
                        (nodes[i].clock(), format!("node {i}"))
                    }
                    Servers::Postgres(server) => (server.clock(), "the server".to_string()),
                    Servers::Mysql(server) => (server.clock(), "the server".to_string()),
                    _ => (None, String::new()),
                };
                let clock = clock
                    .ok_or_else(|| setup_error(format!("{fault}: no stepped server clock")))?;
                let micros = self.clock_step(fault);
                let what = format!("{which}'s wall clock stepped by {micros} µs");
                let id = self.record(fault, None, &what);
                clock.step_micros(micros).map_err(fail)?;
                self.healed(id);
                what
            }
            (Fault::WorkerClockBack | Fault::WorkerClockForward, _) => {
                let w = holder.unwrap_or(0);
                let micros = self.clock_step(fault);
                let what = format!("worker {w}'s wall clock stepped by {micros} µs");
                let id = self.record(fault, holder, &what);
                let stepped = pool.step_clock(w, micros).map_err(fail)?;
                self.healed(id);
                if stepped {
                    what
                } else {
                    format!("worker {w} has no clock of its own (a task): not stepped")
                }
            }
            (fault, _) => return Err(setup_error(format!("{fault} does not apply to this store"))),
        };
        Ok(Some(detail))
    }
}

/// Sets a stepped server clock right again (no step), if the server has one.
fn set_right(clock: Option<&test_servers::ClockControl>) -> test_servers::Result<()> {
    clock.map_or(Ok(()), |clock| clock.set_micros(0))
}

/// Kills the session holding the workers' lock on the MariaDB server at `url` (which names
/// the database; the store's default table and namespace, as the workers use).
async fn kill_mysql_holder(url: String) -> std::result::Result<Option<i64>, sqlx::Error> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(&url).await?;
    let database = url.rsplit('/').next().unwrap_or_default();
    let database = database.split('?').next().unwrap_or_default();
    let name = faults::mysql_lock_name(database, worker::KEY);
    let holder = sqlx::query_scalar::<_, Option<i64>>(MYSQL_HOLDER_SQL)
        .bind(name)
        .fetch_one(&mut conn)
        .await?;
    if let Some(session) = holder {
        // KILL takes no placeholder; the id is an integer the server gave.
        sqlx::raw_sql(&format!("KILL CONNECTION {session}"))
            .execute(&mut conn)
            .await?;
        // KILL only marks the session: it ends at its next check, possibly after a statement
        // in flight has answered (a grant's fence bump, say). The fault lasts until the
        // session is gone from the process list, so a lease it ends is one the fault
        // explains. Bounded: a session the server never ends is the server's fault, not ours.
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_secs(10) {
            let alive = sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            )
            .bind(session)
            .fetch_one(&mut conn)
            .await?;
            if alive == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    Ok(holder)
}
