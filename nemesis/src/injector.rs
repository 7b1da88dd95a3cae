//! The fault injector: injects one fault at a time into the store's servers or a worker of
//! the pool, records its start and its healing in the history, and heals it.

use std::thread;
use std::time::{Duration, Instant};

use fencelock::Result;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use test_servers::zookeeper::{INIT_LIMIT_TICKS, TICK};
use test_servers::{
    EtcdCluster, MariadbServer, PostgresServer, RedisSentinel, RedisServer, ZookeeperEnsemble,
};

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

/// How long the sentinels may take to promote a replica: past `down-after-milliseconds`, an
/// agreement and the promotion, well within ten times the first.
const FAILOVER_WITHIN: Duration = test_servers::DOWN_AFTER.saturating_mul(10);

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
        let Some(holder) = self.holder(fault, pool) else {
            return Ok(None);
        };
        let detail = match (fault, &mut *servers) {
            (Fault::Pause, _) => {
                let pause = self.past_ttl();
                self.pause_worker(fault, holder, pool, "worker", pause)
            }
            (Fault::PauseWaiter, _) => {
                let pause = self.past_bound();
                self.pause_worker(fault, holder, pool, "waiting worker", pause)
            }
            (Fault::Kill, _) => self.kill_worker(fault, holder, pool)?,
            (Fault::Cut, _) => self.cut_worker(fault, holder, pool),
            (Fault::RedlockCutMinority, Servers::Redlock(nodes)) => {
                self.cut_worker_from_minority(fault, holder, pool, nodes.len())
            }
            (Fault::StoreRestart, _) => self.restart_memory(fault, restarting)?,
            (Fault::RedisRestart, Servers::Redis(server)) => self.restart_redis(fault, server)?,
            (Fault::RedlockRestartMinority, Servers::Redlock(nodes)) => {
                self.restart_redlock_minority(fault, nodes)?
            }
            (Fault::EtcdKillLeader, Servers::Etcd(cluster)) => {
                self.kill_etcd_leader(fault, cluster)?
            }
            (Fault::EtcdStopMinority, Servers::Etcd(cluster)) => {
                self.stop_etcd_member(fault, cluster)?
            }
            (Fault::PgTerminate, Servers::Postgres(server)) => {
                self.terminate_pg_holders(fault, pool, server)
            }
            (Fault::PgRestart, Servers::Postgres(server)) => {
                self.fast_restart(fault, "pg_ctl restart -m fast", || server.restart())?
            }
            (Fault::MysqlKill, Servers::Mysql(server)) => {
                self.kill_mysql_holder(fault, pool, server)
            }
            (Fault::MysqlRestart, Servers::Mysql(server)) => {
                self.fast_restart(fault, "mariadbd shutdown and start", || server.restart())?
            }
            (Fault::ZkKillLeader, Servers::Zookeeper(ensemble)) => {
                self.kill_zk_leader(fault, ensemble)?
            }
            (Fault::ZkStopMinority, Servers::Zookeeper(ensemble)) => {
                self.stop_zk_member(fault, ensemble)?
            }
            (Fault::ZkIsolateFollower, Servers::Zookeeper(ensemble)) => {
                self.isolate_zk_follower(fault, ensemble)?
            }
            (Fault::SentinelKillMaster, Servers::Sentinel(deployment)) => {
                self.kill_sentinel_master(fault, deployment)?
            }
            (Fault::SentinelPauseMaster, Servers::Sentinel(deployment)) => {
                self.pause_sentinel_master(fault, deployment)?
            }
            (Fault::SentinelFailover, Servers::Sentinel(deployment)) => {
                self.force_sentinel_failover(fault, deployment)?
            }
            (Fault::SentinelKillSentinel, Servers::Sentinel(deployment)) => {
                self.kill_one_sentinel(fault, deployment)?
            }
            (Fault::ClockBack | Fault::ClockForward, servers) => {
                self.step_server_clock(fault, servers)?
            }
            (Fault::WorkerClockBack | Fault::WorkerClockForward, _) => {
                self.step_worker_clock(fault, holder, pool)?
            }
            (fault, _) => return Err(setup_error(format!("{fault} does not apply to this store"))),
        };
        Ok(Some(detail))
    }

    /// The worker `fault` is aimed at, if it is aimed at one, waiting a while for one (a
    /// holder or a waiter, as its target says) to be there; `None` if none came.
    fn holder(&mut self, fault: Fault, pool: &mut Pool<'_>) -> Option<Option<u32>> {
        match fault.target() {
            Some(target) => {
                let within = self.ttl * 3 + Duration::from_secs(2);
                pool.wait_for_target(target, within, &mut self.rng)
                    .map(Some)
            }
            None => Some(None),
        }
    }

    /// How long a pause-waiter fault freezes its waiter: past rule 4's bound, so a waiter that
    /// keeps the key while frozen is seen.
    fn past_bound(&mut self) -> Duration {
        self.delays.bound(self.ttl) + self.ttl.mul_f64(self.rng.random_range(0.5..1.5))
    }

    /// Freezes worker `holder` (`who`, in the detail) for `pause`, then lets it go on.
    fn pause_worker(
        &mut self,
        fault: Fault,
        holder: Option<u32>,
        pool: &Pool<'_>,
        who: &str,
        pause: Duration,
    ) -> String {
        let w = holder.unwrap_or(0);
        let id = self.record(fault, holder, &format!("{who} {w} for {pause:?}"));
        pool.pause(w, true);
        thread::sleep(pause);
        pool.pause(w, false);
        self.healed(id);
        format!("{who} {w} paused for {pause:?}")
    }

    /// Kills worker `holder` and starts a replacement in its mode, so the pool keeps its size.
    fn kill_worker(
        &mut self,
        fault: Fault,
        holder: Option<u32>,
        pool: &mut Pool<'_>,
    ) -> Result<String> {
        let w = holder.unwrap_or(0);
        let id = self.record(fault, holder, &format!("worker {w}"));
        let mode = pool.mode_of.get(&w).copied();
        pool.kill(w);
        let replacement = pool.spawn(mode)?;
        self.healed(id);
        Ok(format!("worker {w} killed, worker {replacement} started"))
    }

    /// Cuts worker `holder` off from the store past the TTL, then restores its way there.
    fn cut_worker(&mut self, fault: Fault, holder: Option<u32>, pool: &Pool<'_>) -> String {
        let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
        let id = self.record(fault, holder, &format!("worker {w} for {cut:?}"));
        pool.cut(w, true, None);
        thread::sleep(cut);
        pool.cut(w, false, None);
        self.healed(id);
        format!("worker {w} cut off for {cut:?}")
    }

    /// Cuts worker `holder` off from a minority of the `nodes` Redlock nodes past the TTL:
    /// it still reaches a quorum.
    fn cut_worker_from_minority(
        &mut self,
        fault: Fault,
        holder: Option<u32>,
        pool: &Pool<'_>,
        nodes: usize,
    ) -> String {
        let (w, cut) = (holder.unwrap_or(0), self.past_ttl());
        let picked = self.minority(nodes);
        let what = format!("worker {w} from nodes {picked:?} for {cut:?}");
        let id = self.record(fault, holder, &what);
        pool.cut(w, true, Some(&picked));
        thread::sleep(cut);
        pool.cut(w, false, Some(&picked));
        self.healed(id);
        what
    }

    /// A random minority of `nodes` nodes (fewer than half), by index.
    fn minority(&mut self, nodes: usize) -> Vec<usize> {
        let mut picked: Vec<usize> = (0..nodes).collect();
        picked.shuffle(&mut self.rng);
        picked.truncate(nodes.saturating_sub(1) / 2);
        picked
    }

    /// Restarts the memory store, which forgets every lock.
    fn restart_memory(
        &mut self,
        fault: Fault,
        restarting: Option<&RestartingMemory>,
    ) -> Result<String> {
        let store = restarting.ok_or_else(|| setup_error("not a restartable store"))?;
        let id = self.record(fault, None, "memory store restarted");
        store.restart();
        self.healed(id);
        Ok("memory store restarted".to_string())
    }

    /// Kills the Redis server and restarts it empty, its clock set right.
    fn restart_redis(&mut self, fault: Fault, server: &mut RedisServer) -> Result<String> {
        let fail = fault_error(fault);
        let id = self.record(fault, None, "SIGKILL, restart empty");
        // Empty, its clock may come back right: behind, it would mint below the
        // tokens its lost fence keys had reached (the store's docs' failure).
        set_right(server.clock()).map_err(&fail)?;
        server.restart().map_err(&fail)?;
        self.healed(id);
        Ok("killed and restarted empty".to_string())
    }

    /// Records `fault` as `what`, restarts the server with `restart` (which returns once it
    /// accepts connections again), and records the healing.
    fn fast_restart(
        &mut self,
        fault: Fault,
        what: &str,
        restart: impl FnOnce() -> test_servers::Result<()>,
    ) -> Result<String> {
        let id = self.record(fault, None, what);
        restart().map_err(fault_error(fault))?;
        self.healed(id);
        Ok("fast restart".to_string())
    }

    /// Kills a minority of the Redlock nodes and, past the TTL, restarts them empty.
    fn restart_redlock_minority(
        &mut self,
        fault: Fault,
        nodes: &mut [RedisServer],
    ) -> Result<String> {
        let fail = fault_error(fault);
        let picked = self.minority(nodes.len());
        let down = self.past_ttl();
        let what = format!("nodes {picked:?} killed, restarted empty after {down:?}");
        let id = self.record(fault, None, &what);
        for &i in &picked {
            nodes[i].kill().map_err(&fail)?;
        }
        thread::sleep(down);
        for &i in &picked {
            set_right(nodes[i].clock()).map_err(&fail)?;
            nodes[i].restart().map_err(&fail)?;
        }
        self.healed(id);
        Ok(what)
    }

    /// Kills the etcd cluster's leader and restarts it past the TTL.
    fn kill_etcd_leader(&mut self, fault: Fault, cluster: &mut EtcdCluster) -> Result<String> {
        let fail = fault_error(fault);
        let leader = cluster.leader().map_err(&fail)?;
        let down = self.past_ttl();
        let what = format!("leader (member {leader}) killed, restarted after {down:?}");
        let id = self.record(fault, None, &what);
        cluster.kill(leader).map_err(&fail)?;
        thread::sleep(down);
        cluster.restart(leader).map_err(&fail)?;
        self.healed(id);
        Ok(what)
    }

    /// Stops a random etcd member (SIGSTOP) past the TTL, then resumes it.
    fn stop_etcd_member(&mut self, fault: Fault, cluster: &mut EtcdCluster) -> Result<String> {
        let fail = fault_error(fault);
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
        cluster.pause(member).map_err(&fail)?;
        thread::sleep(stopped);
        cluster.resume(member).map_err(&fail)?;
        self.healed(id);
        Ok(what)
    }

    /// Terminates the sessions holding advisory locks on the PostgreSQL server.
    fn terminate_pg_holders(
        &mut self,
        fault: Fault,
        pool: &Pool<'_>,
        server: &PostgresServer,
    ) -> String {
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

    /// Kills the session holding the workers' lock on the MariaDB server.
    fn kill_mysql_holder(
        &mut self,
        fault: Fault,
        pool: &Pool<'_>,
        server: &MariadbServer,
    ) -> String {
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

    /// Kills the ZooKeeper ensemble's leader and restarts it past the TTL.
    fn kill_zk_leader(&mut self, fault: Fault, ensemble: &mut ZookeeperEnsemble) -> Result<String> {
        let fail = fault_error(fault);
        let leader = ensemble.leader().map_err(&fail)?;
        let down = self.past_ttl();
        let what = format!("leader (member {leader}) killed, restarted after {down:?}");
        let id = self.record(fault, None, &what);
        ensemble.kill(leader).map_err(&fail)?;
        thread::sleep(down);
        ensemble.restart(leader).map_err(&fail)?;
        self.healed(id);
        Ok(what)
    }

    /// Stops a random ZooKeeper member (SIGSTOP) past the TTL, then resumes it.
    fn stop_zk_member(&mut self, fault: Fault, ensemble: &mut ZookeeperEnsemble) -> Result<String> {
        let fail = fault_error(fault);
        let member = self.rng.random_range(0..ensemble.member_count());
        let stopped = self.past_ttl();
        let leader = ensemble.leader().ok() == Some(member);
        let what = format!(
            "member {member}{} stopped for {stopped:?}",
            if leader { " (the leader)" } else { "" }
        );
        let id = self.record(fault, None, &what);
        ensemble.pause(member).map_err(&fail)?;
        thread::sleep(stopped);
        ensemble.resume(member).map_err(&fail)?;
        self.healed(id);
        Ok(what)
    }

    /// Kills the Sentinel deployment's master; once the sentinels promoted a replica, starts
    /// it again empty, as a replica of the new one. Healed once a replica follows the new one.
    fn kill_sentinel_master(
        &mut self,
        fault: Fault,
        deployment: &mut RedisSentinel,
    ) -> Result<String> {
        let fail = fault_error(fault);
        let master = deployment.master().map_err(&fail)?;
        let id = self.record(fault, None, &format!("master {master} killed"));
        deployment.kill(master).map_err(&fail)?;
        let new = deployment
            .wait_master_other_than(master, FAILOVER_WITHIN)
            .map_err(&fail)?;
        deployment.restart(master).map_err(&fail)?;
        // The run's store asks one replica to acknowledge every grant: until the old master
        // is demoted and a replica follows the new one, grants fall short, so the fault lasts.
        deployment
            .wait_failover_settled(master, new, FAILOVER_WITHIN)
            .map_err(&fail)?;
        self.healed(id);
        Ok(format!(
            "master {master} killed, {new} promoted, {master} back as its replica"
        ))
    }

    /// Freezes the Sentinel deployment's master until the sentinels promoted a replica; healed
    /// once the failover settled (the old master demoted, a replica following the new one).
    fn pause_sentinel_master(
        &mut self,
        fault: Fault,
        deployment: &mut RedisSentinel,
    ) -> Result<String> {
        let fail = fault_error(fault);
        let master = deployment.master().map_err(&fail)?;
        let id = self.record(fault, None, &format!("master {master} paused"));
        deployment.pause(master).map_err(&fail)?;
        let promoted = deployment.wait_master_other_than(master, FAILOVER_WITHIN);
        // Resumed whatever happened, so a failed wait does not leave it frozen.
        deployment.resume(master).map_err(&fail)?;
        let new = promoted.map_err(&fail)?;
        deployment
            .wait_failover_settled(master, new, FAILOVER_WITHIN)
            .map_err(&fail)?;
        self.healed(id);
        Ok(format!("master {master} paused until {new} was promoted"))
    }

    /// `SENTINEL FAILOVER`, healed once the failover settled: the old master demoted and a
    /// replica following the new one.
    fn force_sentinel_failover(
        &mut self,
        fault: Fault,
        deployment: &mut RedisSentinel,
    ) -> Result<String> {
        let fail = fault_error(fault);
        let old = deployment.master().map_err(&fail)?;
        let id = self.record(fault, None, "SENTINEL FAILOVER");
        let new = deployment.failover().map_err(&fail)?;
        deployment
            .wait_failover_settled(old, new, FAILOVER_WITHIN)
            .map_err(&fail)?;
        self.healed(id);
        Ok(format!("failed over to {new}"))
    }

    /// Kills one sentinel and starts it again past the TTL.
    fn kill_one_sentinel(
        &mut self,
        fault: Fault,
        deployment: &mut RedisSentinel,
    ) -> Result<String> {
        let fail = fault_error(fault);
        let sentinels = deployment.sentinel_ports();
        let sentinel = sentinels[self.rng.random_range(0..sentinels.len())];
        let down = self.past_ttl();
        let what = format!("sentinel {sentinel} killed, restarted after {down:?}");
        let id = self.record(fault, None, &what);
        deployment.kill(sentinel).map_err(&fail)?;
        thread::sleep(down);
        deployment.restart(sentinel).map_err(&fail)?;
        self.healed(id);
        Ok(what)
    }

    /// Cuts a ZooKeeper follower off from the quorum past the TTL, its clients still
    /// connected, and heals it once it serves again; the detail says how it served them.
    fn isolate_zk_follower(
        &mut self,
        fault: Fault,
        ensemble: &mut ZookeeperEnsemble,
    ) -> Result<String> {
        let fail = fault_error(fault);
        let (member, sessions) = self.pick_zk_follower(ensemble).map_err(&fail)?;
        let cut = self.past_ttl();
        let sessions = if sessions {
            "workers' sessions on it"
        } else {
            "no worker's session on it"
        };
        let what = format!(
            "follower (member {member}, {sessions}) cut off from the quorum for {cut:?}, \
             its clients connected"
        );
        let id = self.record(fault, None, &what);
        ensemble.isolate(member, true).map_err(&fail)?;
        // Watched, so the report says whether it dropped its clients (after syncLimit).
        let stopped = watch_serving(ensemble, member, cut);
        ensemble.isolate(member, false).map_err(&fail)?;
        // Healed once it serves again, so the next fault finds the whole ensemble.
        let mended = Instant::now();
        let serving = await_serving(ensemble, member, mended);
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
        Ok(format!("{what}; {stopped}, {rejoined}"))
    }

    /// A follower of the ZooKeeper ensemble to cut off, and whether workers' lease sessions
    /// are on it.
    fn pick_zk_follower(
        &mut self,
        ensemble: &ZookeeperEnsemble,
    ) -> test_servers::Result<(usize, bool)> {
        let leader = ensemble.leader()?;
        let followers: Vec<usize> = (0..ensemble.member_count())
            .filter(|&m| m != leader)
            .collect();
        // Preferably one the workers' lease sessions are on (their TTL names them):
        // sessions leave a cut follower and stay where they land, so a blind pick soon
        // hits no one.
        let with_sessions = ensemble.members_serving_timeout(self.delays.granted_ttl(self.ttl));
        let busy: Vec<usize> = followers
            .iter()
            .copied()
            .filter(|m| with_sessions.contains(m))
            .collect();
        let from = if busy.is_empty() { &followers } else { &busy };
        let member = from[self.rng.random_range(0..from.len())];
        Ok((member, busy.contains(&member)))
    }

    /// Steps the wall clock of the server (or of a random Redlock node) by a clock fault's
    /// step; the servers run under a stepped clock for it.
    fn step_server_clock(&mut self, fault: Fault, servers: &Servers) -> Result<String> {
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
        let clock =
            clock.ok_or_else(|| setup_error(format!("{fault}: no stepped server clock")))?;
        let micros = self.clock_step(fault);
        let what = format!("{which}'s wall clock stepped by {micros} µs");
        let id = self.record(fault, None, &what);
        clock.step_micros(micros).map_err(fault_error(fault))?;
        self.healed(id);
        Ok(what)
    }

    /// Steps worker `holder`'s wall clock by a worker clock fault's step (a worker process
    /// has a clock of its own).
    fn step_worker_clock(
        &mut self,
        fault: Fault,
        holder: Option<u32>,
        pool: &Pool<'_>,
    ) -> Result<String> {
        let w = holder.unwrap_or(0);
        let micros = self.clock_step(fault);
        let what = format!("worker {w}'s wall clock stepped by {micros} µs");
        let id = self.record(fault, holder, &what);
        let stepped = pool.step_clock(w, micros).map_err(fault_error(fault))?;
        self.healed(id);
        Ok(if stepped {
            what
        } else {
            format!("worker {w} has no clock of its own (a task): not stepped")
        })
    }
}

/// Makes a server error during `fault` a setup error that names the fault.
fn fault_error(fault: Fault) -> impl Fn(test_servers::Error) -> fencelock::Error {
    move |e| setup_error(format!("{fault}: {e}"))
}

/// Watches a cut-off ZooKeeper `member` for `cut`: how long after the cut it stopped serving
/// its clients, if it did.
fn watch_serving(ensemble: &ZookeeperEnsemble, member: usize, cut: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut stopped = None;
    while start.elapsed() < cut {
        if stopped.is_none() && !ensemble.is_serving(member) {
            stopped = Some(start.elapsed());
        }
        thread::sleep(SERVING_POLL.min(cut.saturating_sub(start.elapsed())));
    }
    stopped
}

/// Waits until [`REJOIN_TIMEOUT`] after `mended` for a ZooKeeper `member` to serve again;
/// whether it does.
fn await_serving(ensemble: &ZookeeperEnsemble, member: usize, mended: Instant) -> bool {
    let mut serving = ensemble.is_serving(member);
    while !serving && mended.elapsed() < REJOIN_TIMEOUT {
        thread::sleep(SERVING_POLL);
        serving = ensemble.is_serving(member);
    }
    serving
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
