//! A Redis Cluster of `redis-server` processes on free loopback ports, made with
//! `redis-cli --cluster create`: see [`RedisServer::start_cluster`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::clock_shim;
use crate::process::{self, log_marker, start_error, wait_ready, Proc, TempDir};
use crate::redis::ping;
use crate::{Error, RedisServer, Result};

/// How long a node waits for a peer before it flags it as failing (`cluster-node-timeout`):
/// short, so a killed master is noticed within seconds.
const NODE_TIMEOUT_MS: u32 = 2000;

/// A Redis Cluster for tests: `masters` masters, each with `replicas` replicas, every node a
/// `redis-server` child process on free ports of 127.0.0.1 (client port and cluster bus port),
/// in its own directory with its own `nodes.conf`, without persistence. Always local.
///
/// [`ports`](Self::ports) lists the masters as created, then their replicas in the same order:
/// with `m` masters and `r` replicas each, node `m + i * r + k` is the `k`th replica of master
/// `i`. The constructors return once every node reports `cluster_state:ok` and every replica's
/// link to its master is up.
///
/// Dropping it kills every node and removes their directories.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    cli: PathBuf,
}

#[derive(Debug)]
struct Node {
    // Dropped (killed) before `dir` is removed.
    proc: Proc,
    port: u16,
    bus: u16,
    log: PathBuf,
    /// How far the node's wall clock runs behind this host's ([`clock_shim`]); `None`: not moved.
    clock_back: Option<Duration>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a Redis Cluster of `masters` masters (at least 3, as `redis-cli --cluster create`
    /// wants), each with `replicas_per_master` replicas, and waits until every node reports
    /// `cluster_state:ok` and every replica's link to its master is up. Needs `redis-server` and `redis-cli` (Debian: `redis-server`,
    /// `redis-tools`); a missing one is [`Error::MissingBinary`].
    pub fn start_cluster(masters: usize, replicas_per_master: usize) -> Result<RedisCluster> {
        RedisCluster::start(masters, replicas_per_master, None)
    }
}

impl RedisCluster {
    /// As [`RedisServer::start_cluster`], but the replicas of the first master
    /// (`ports()[0]`) run with their wall clock `back` (whole seconds) behind this host's:
    /// their `TIME`, their key expiry and every other wall-clock reading, while their
    /// monotonic clock is this host's. Promoting one of them gives that shard a master whose
    /// clock is behind every other node's.
    ///
    /// The clock is moved by a small library preloaded into those `redis-server`s (Debian's
    /// `faketime` deadlocks them at start), built once per process with `cc` (Debian: `gcc`;
    /// missing, it is [`Error::MissingBinary`]).
    pub fn start_with_replica_clock_back(
        masters: usize,
        replicas_per_master: usize,
        back: Duration,
    ) -> Result<Self> {
        Self::start(masters, replicas_per_master, Some(back))
    }

    fn start(masters: usize, replicas: usize, clock_back: Option<Duration>) -> Result<Self> {
        if masters < 3 {
            return Err(Error::InvalidArgument(format!(
                "a Redis Cluster needs at least 3 masters, not {masters}"
            )));
        }
        let binary = crate::redis::server_binary()?;
        let cli = process::find_binary("redis-cli", "redis-tools")?;
        let count = masters * (1 + replicas);
        let ports = process::free_ports(2 * count)?;
        let mut nodes = Vec::with_capacity(count);
        for i in 0..count {
            let (port, bus) = (ports[2 * i], ports[2 * i + 1]);
            let dir = TempDir::new("redis-cluster", port, None)?;
            let log = dir.path().join("redis.log");
            // The replicas of master 0 are nodes masters..masters + replicas.
            let behind = i >= masters && i < masters + replicas;
            let mut node = Node {
                proc: Proc::none(),
                port,
                bus,
                log,
                clock_back: clock_back.filter(|_| behind),
                dir,
            };
            node.launch(&binary)?;
            nodes.push(node);
        }
        let cluster = RedisCluster { nodes, cli };
        cluster.create(masters)?;
        cluster.attach_replicas(masters, replicas)?;
        cluster.wait_ok(Duration::from_secs(30))?;
        cluster.wait_replicas_linked(masters, Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create` of the first `masters` nodes, which get the slots.
    fn create(&self, masters: usize) -> Result<()> {
        let mut command = Command::new(&self.cli);
        command.arg("--cluster").arg("create");
        for node in &self.nodes[..masters] {
            command.arg(format!("127.0.0.1:{}", node.port));
        }
        command.arg("--cluster-yes");
        let log = &self.nodes[0].log;
        log_marker(log, "redis-cli --cluster create");
        process::run_logged(command, log)
            .map_err(|reason| start_error("redis-cli --cluster create", reason, log))
    }

    /// Makes node `masters + i * replicas + k` a replica of master `i` (`redis-cli --cluster
    /// create --cluster-replicas` pairs them at random when every node has the same address):
    /// `CLUSTER MEET` the first master, then `CLUSTER REPLICATE` once the node knows its master.
    fn attach_replicas(&self, masters: usize, replicas: usize) -> Result<()> {
        let first = &self.nodes[0];
        let (meet_port, meet_bus) = (first.port.to_string(), first.bus.to_string());
        let mut ids = Vec::with_capacity(masters);
        for node in &self.nodes[..masters] {
            ids.push(
                self.query(node.port, &["CLUSTER", "MYID"])?
                    .trim()
                    .to_owned(),
            );
        }
        let replica_nodes = &self.nodes[masters..];
        for node in replica_nodes {
            let answer = self.query(
                node.port,
                &["CLUSTER", "MEET", "127.0.0.1", &meet_port, &meet_bus],
            )?;
            if answer.trim() != "OK" {
                return Err(start_error(
                    "the Redis Cluster",
                    format!("CLUSTER MEET on {} answered {answer:?}", node.port),
                    &node.log,
                ));
            }
        }
        let started = Instant::now();
        for (n, node) in replica_nodes.iter().enumerate() {
            let id = &ids[n / replicas];
            loop {
                // "ERR Unknown node" until the gossip has reached this node.
                let answer = self.query(node.port, &["CLUSTER", "REPLICATE", id])?;
                if answer.trim() == "OK" {
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    return Err(start_error(
                        "the Redis Cluster",
                        format!(
                            "CLUSTER REPLICATE {id} on {} still answers {answer:?} after 30 s",
                            node.port
                        ),
                        &node.log,
                    ));
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Waits until every replica reports `master_link_status:up` and every master lists
    /// `replicas` of them as connected (`INFO replication`); fails after `bound`.
    fn wait_replicas_linked(&self, masters: usize, bound: Duration) -> Result<()> {
        let replicas = (self.nodes.len() - masters) / masters;
        let started = Instant::now();
        let linked = |node: &Node, master: bool| {
            let wanted = if master {
                format!("connected_slaves:{replicas}")
            } else {
                "master_link_status:up".to_owned()
            };
            self.query(node.port, &["INFO", "replication"])
                .is_ok_and(|info| info.lines().any(|line| line.trim() == wanted))
        };
        loop {
            let waiting = self
                .nodes
                .iter()
                .enumerate()
                .find(|(i, node)| !linked(node, *i < masters));
            let Some((_, node)) = waiting else {
                return Ok(());
            };
            if started.elapsed() > bound {
                return Err(start_error(
                    "the Redis Cluster",
                    format!(
                        "the node on {} has not got its replication links up after {bound:?}",
                        node.port
                    ),
                    &node.log,
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every running node answers `CLUSTER INFO` with `cluster_state:ok` and knows
    /// a master for every slot; fails after `bound`.
    pub fn wait_ok(&self, bound: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let ok = self.running().all(|node| {
                self.query(node.port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if started.elapsed() > bound {
                let states: Vec<String> = self
                    .running()
                    .map(|node| {
                        let info = self.query(node.port, &["CLUSTER", "INFO"]);
                        let state = info.ok().and_then(|i| {
                            i.lines()
                                .find(|l| l.starts_with("cluster_state"))
                                .map(str::to_owned)
                        });
                        format!("{}: {state:?}", node.port)
                    })
                    .collect();
                return Err(start_error(
                    "the Redis Cluster",
                    format!(
                        "not cluster_state:ok after {bound:?}: {}",
                        states.join(", ")
                    ),
                    &self.nodes[0].log,
                ));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…`: every node, masters first.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node's client port, masters (as created) first.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|node| node.port).collect()
    }

    /// The client ports of the nodes that are masters now, as a running node sees it.
    pub fn masters(&self) -> Result<Vec<u16>> {
        Ok(self
            .cluster_nodes()?
            .into_iter()
            .filter(|line| line.master && !line.failed)
            .map(|line| line.port)
            .collect())
    }

    /// The slot of `name` (`CLUSTER KEYSLOT`): the slot of its hash tag if it has one.
    pub fn keyslot(&self, name: &str) -> Result<u16> {
        let port = self.any_running()?;
        let answer = self.query(port, &["CLUSTER", "KEYSLOT", name])?;
        answer
            .trim()
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("CLUSTER KEYSLOT answered {answer:?}")))
    }

    /// The client port of the master serving `slot` now.
    pub fn master_of_slot(&self, slot: u16) -> Result<u16> {
        self.cluster_nodes()?
            .into_iter()
            .find(|line| {
                line.master
                    && !line.failed
                    && line.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|line| line.port)
            .ok_or_else(|| Error::InvalidArgument(format!("no live master serves slot {slot}")))
    }

    /// The client port of a replica of the master on `master` (the first one listed).
    /// Retried for up to 10 s: a node learns of a replica a moment after the cluster is created.
    pub fn replica_of(&self, master: u16) -> Result<u16> {
        let started = Instant::now();
        loop {
            match self.replica_now(master) {
                Err(_) if started.elapsed() < Duration::from_secs(10) => {
                    thread::sleep(Duration::from_millis(100))
                }
                found => return found,
            }
        }
    }

    fn replica_now(&self, master: u16) -> Result<u16> {
        let lines = self.cluster_nodes()?;
        let id = lines
            .iter()
            .find(|line| line.port == master)
            .map(|line| line.id.clone())
            .ok_or_else(|| Error::InvalidArgument(format!("no node on port {master}")))?;
        lines
            .iter()
            .find(|line| line.master_id.as_deref() == Some(id.as_str()) && !line.failed)
            .map(|line| line.port)
            .ok_or_else(|| Error::InvalidArgument(format!("the master on {master} has no replica")))
    }

    /// Kills the node on `port` (`SIGKILL`); it stays down.
    pub fn kill(&mut self, port: u16) -> Result<()> {
        self.node_mut(port)?.proc.kill();
        Ok(())
    }

    /// Freezes the node on `port` (`SIGSTOP`) until [`resume`](Self::resume): a paused replica
    /// receives no replication stream meanwhile.
    pub fn pause(&self, port: u16) -> Result<()> {
        self.node(port)?
            .proc
            .pause(&format!("redis cluster node 127.0.0.1:{port}"))
    }

    /// Lets a paused node run again (`SIGCONT`).
    pub fn resume(&self, port: u16) -> Result<()> {
        self.node(port)?
            .proc
            .resume(&format!("redis cluster node 127.0.0.1:{port}"))
    }

    /// Promotes the replica on `replica` at once (`CLUSTER FAILOVER TAKEOVER`: no agreement
    /// of the other masters, no handshake with its master, which may be dead), then waits
    /// until it says it is a master and every running node reports `cluster_state:ok`.
    pub fn promote(&self, replica: u16) -> Result<()> {
        let answer = self.query(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"])?;
        if answer.trim() != "OK" {
            return Err(Error::InvalidArgument(format!(
                "CLUSTER FAILOVER TAKEOVER on {replica} answered {answer:?}"
            )));
        }
        let started = Instant::now();
        while !self
            .query(replica, &["ROLE"])
            .is_ok_and(|role| role.starts_with("master"))
        {
            if started.elapsed() > Duration::from_secs(15) {
                return Err(Error::InvalidArgument(format!(
                    "the replica on {replica} is not a master 15 s after TAKEOVER"
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
        self.wait_ok(Duration::from_secs(30))
    }

    /// Runs one command with `redis-cli` on the node on `port` and returns its output
    /// (`redis-cli`'s plain rendering: a bulk string as is, an array one element a line).
    pub fn query(&self, port: u16, args: &[&str]) -> Result<String> {
        let output = Command::new(&self.cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()?;
        if !output.status.success() {
            return Err(Error::InvalidArgument(format!(
                "redis-cli on {port} {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .filter(|node| node.proc.is_running() && !node.proc.is_paused())
    }

    fn any_running(&self) -> Result<u16> {
        self.running()
            .map(|node| node.port)
            .next()
            .ok_or_else(|| Error::NotRunning("every Redis Cluster node".into()))
    }

    fn node(&self, port: u16) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|node| node.port == port)
            .ok_or_else(|| Error::InvalidArgument(format!("no cluster node on port {port}")))
    }

    fn node_mut(&mut self, port: u16) -> Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|node| node.port == port)
            .ok_or_else(|| Error::InvalidArgument(format!("no cluster node on port {port}")))
    }

    /// `CLUSTER NODES` as a running node sees it.
    fn cluster_nodes(&self) -> Result<Vec<NodeLine>> {
        let port = self.any_running()?;
        let text = self.query(port, &["CLUSTER", "NODES"])?;
        Ok(text.lines().filter_map(NodeLine::parse).collect())
    }
}

/// One line of `CLUSTER NODES`:
/// `id ip:port@bus flags master_id ping pong epoch link slot…`.
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    master_id: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return None;
        }
        let address = fields[1].split('@').next()?;
        let port = address.rsplit(':').next()?.parse().ok()?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let slots = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(NodeLine {
            id: fields[0].to_owned(),
            port,
            master: flags.contains(&"master"),
            failed: flags.contains(&"fail") || flags.contains(&"fail?"),
            master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
            slots,
        })
    }
}

impl Node {
    fn launch(&mut self, binary: &Path) -> Result<()> {
        let what = format!("redis cluster node on 127.0.0.1:{}", self.port);
        log_marker(&self.log, &format!("starting {what}"));
        let mut command = Command::new(binary);
        let port = self.port;
        command
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--cluster-port", &self.bus.to_string()])
            .args(["--cluster-allow-replica-migration", "no"])
            // A replica's first full sync starts at once, not 5 s later (7.0's default).
            .args(["--repl-diskless-sync-delay", "0"])
            .current_dir(self.dir.path());
        if let Some(back) = self.clock_back {
            clock_shim::set_back(&mut command, back)?;
        }
        self.proc = Proc::spawn(command, &self.log)?;
        wait_ready(&mut self.proc, &what, &self.log, || ping(port))
    }
}
