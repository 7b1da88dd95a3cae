//! fencelock on one Redis server: `SET NX PX` locks with fencing tokens minted in Lua, and
//! waiters woken by pub/sub; shared leases (reader-writer locks) and semaphore permits on the
//! same keys and the same fence.
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release};
//! use fencelock_redis::{RedisConfig, RedisStore};
//!
//! let config = RedisConfig::from_url("redis://cache.internal:6379/0?prefix=billing:")?;
//! let store = RedisStore::connect(config).await?;
//! let lease = store.acquire("nightly-export", Duration::from_secs(30), Duration::from_secs(5)).await?;
//! // ... every write carries lease.fencing_token() ...
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! - **Keys.** A lock key `k` is stored as `{prefix}{k}:lock` (the owner id, with a `PX`
//!   expiry), its fencing counter as `{prefix}{k}:fence`, and releases are published on
//!   `{prefix}{k}:released`, with `%` and `}` in `k` written `%25` and `%7D`. The braces are
//!   a Redis Cluster hash tag: all three names hash by the whole (escaped) key, so one script
//!   can touch them on a Cluster too. Keys and owners always travel as `KEYS`/`ARGV`, never as
//!   script text. Shared leases and permits add two sorted sets under the same tag,
//!   `{prefix}{k}:holders` and `{prefix}{k}:writers` (`# Shared leases and permits`).
//! - **Acquire** is one Lua script (`EVALSHA`, reloaded on `NOSCRIPT`): `SET lock owner NX PX
//!   ttl`, and if that set the key, the token `max(fence + 1, server TIME in µs)`, written back
//!   to the fence. A held key answers with its `PTTL`, which a waiter sleeps on.
//! - **Release** is compare-and-delete in a script that also `PUBLISH`es on the key's channel;
//!   it answers released or lost. **Extend** is compare-and-`PEXPIRE`, which never recreates a
//!   missing key.
//! - **Waiting.** A waiting acquire subscribes to the key's channel on the handle's one shared
//!   pub/sub connection (one `SUBSCRIBE` per key, counted across waiters) and waits for the
//!   confirmation before its next attempt, so a release between an attempt and the wait is
//!   never missed. It then tries again on every release message, when the holder's `PTTL` runs
//!   out, and at least every [`WAIT_CAP`] (250 ms), so a lost message (a dropped pub/sub
//!   connection, a busy server) costs a bounded delay, never a TTL.
//! - **Timeouts.** One multiplexed connection per handle (`ConnectionManager`, reconnected
//!   after a failure); every command runs under the command timeout, so a hung server
//!   (`SIGSTOP`) or an unreachable one gives the retryable [`Error::Unavailable`] rather than
//!   a hang.
//!
//! # What is guaranteed
//! - At most one live lease per key while the server keeps its data: the lock is one key and
//!   `SET NX` is atomic.
//! - In shared and permit mode, while the server keeps its data: no exclusive lease next to a
//!   shared or permit one, at most `L` live permits per key, each in its own slot, and one
//!   limit per key at a time; every check and change of a key's holders is one script.
//! - Tokens grow across all modes of a key: every acquire mints from the one fence.
//! - Tokens only grow per key, even after the server loses its data (restart without
//!   persistence, `FLUSHALL`, eviction of the fence key): a lost fence restarts from the
//!   server's clock in microseconds, which is past every earlier token as long as that clock
//!   only moves forward (every earlier token was at most the clock reading of its own grant,
//!   unless more than one grant per microsecond pushed the counter ahead of it).
//! - A lease's local deadline (`sent_at + ttl − drift`) comes before the server's expiry:
//!   `sent_at` is read before the script is sent, the server counts the TTL (rounded up to a
//!   millisecond) from when it runs it.
//! - The keep-alive's lost signal fires before the server's `PTTL` runs out when extends
//!   cannot be confirmed (a hung or unreachable server), because every command is bounded by
//!   the command timeout and the deadline keeps a drift margin.
//!
//! # What is not
//! - Like every lock, no protection against a holder that keeps working after its deadline:
//!   check the fencing token at the resource.
//! - A holder that dies keeps the lock until its TTL runs out ([`Capabilities`] says
//!   `frees_on_disconnect: false`).
//! - **Replication and failover are unsafe.** Redis replicates asynchronously: a lock granted
//!   on a primary that fails before the write reaches its replica is unknown to the promoted
//!   replica, and a second holder gets the key. The token then comes from the replica's fence
//!   and clock: if that clock is behind the old primary's, the new token can be *smaller* than
//!   one already handed out. Use Redlock (`redlock://`) or etcd when this matters.
//! - **A server clock stepped backwards** (NTP step, a VM restored from a snapshot) while the
//!   fence key is also lost can mint a token smaller than an earlier one. With the fence key
//!   intact, tokens stay monotonic whatever the clock does.
//! - Waiters are not served in order (`fair_queue: false`): on a release every waiter tries,
//!   and whoever's script runs first wins.
//! - Each distinct key leaves its fence key behind for one retention window after its last
//!   acquire (`# Per-key state`): that is what keeps tokens monotonic across releases.
//! - On a **Redis Cluster** (`redis+cluster://`, see `# Redis Cluster`) the same scripts run on
//!   each key's slot master; failover there is the replica case above, which
//!   `min_replicas` narrows for tokens.
//! - **Memory eviction** can delete a held lock; the store refuses such a server unless told
//!   otherwise (next section).
//!
//! # Redis Cluster
//! `redis+cluster://[user:password@]host:port[,host:port…][?options]` connects the same
//! [`RedisStore`] through the redis crate's Cluster client. Every key of a lock (lock, fence,
//! holders, writers) shares one hash tag, so each script runs on the key's slot master, and the
//! options are those of `redis://` but `layout=plain` (lock and fence would hash to different
//! slots), a database other than 0 and TLS (`rediss+cluster://` is not supported yet), which
//! are refused. Wake-ups come from pub/sub on a seed node (`PUBLISH` reaches every node); the
//! eviction check runs on every master. `stored_keys` (`lockctl stats`) is `Unsupported`.
//! - **Failover.** Replication is asynchronous: a lock granted on a master that dies before its
//!   replica got it is lost (two holders), and once the tokens have passed the promoted
//!   replica's clock it can mint a token no greater than one already handed out.
//! - **`min_replicas=N`** (with `replica_timeout`, default 500 ms, below `command_timeout`):
//!   every acquire script goes out in one pipeline with `WAIT N replica_timeout` on the slot
//!   master's connection (`WAIT` counts that connection's writes only; one pipeline keeps a
//!   reconnect from giving it a fresh connection, whose `WAIT` would succeed at once). A grant
//!   that fewer replicas acknowledged is released and refused with the retryable
//!   [`Error::Unavailable`](fencelock_core::Error::Unavailable). A request whose TTL is below
//!   twice `replica_timeout` is refused with [`Error::InvalidInput`] naming that rule (the
//!   acknowledgement may take up to `replica_timeout`, and such a lease could be expired on
//!   arrival); `Capabilities::min_ttl` says so. Every token handed out is
//!   then on a replica, so a failover to that replica keeps tokens growing; the lock itself is
//!   still only as safe as Redis replication (`WAIT` does not make Redis consistent: a
//!   failover to a replica that did not acknowledge loses it).
//!   `tests/cluster_faults.rs` shows both with a replica whose wall clock runs a day behind
//!   every other node's (a clock shim `test-servers` preloads; Debian's redis-server, built
//!   with jemalloc, does not start under libfaketime): without `WAIT` the promoted replica
//!   mints a token not above the lost one; with `min_replicas=1` one above every acknowledged
//!   token, from the replicated fence, not the clock.
//! - Redis 7 replicates an expiry as an absolute time, which a promoted replica reads on its
//!   own clock: behind, it keeps a lease past its TTL (safe, but the next holder waits); ahead,
//!   it frees the lease early, and only the fencing token keeps the old holder's writes out.
//! - **Resent requests.** After an I/O error the Cluster client sends a command (with
//!   `min_replicas`, the whole script-and-`WAIT` pipeline) again, so an acquire script may run
//!   twice. Each attempt has a fresh owner id, and a permit acquire that finds a live slot of
//!   its own owner answers that grant and changes nothing: a resend never takes a second slot
//!   (`script.rs`, `a_resent_permit_acquire_answers_its_grant_and_takes_one_slot`). An
//!   exclusive acquire run twice finds the key held (by its own first run): the caller sees
//!   `Busy`, or waits, and that lock stays until its TTL; a shared acquire run twice adds a
//!   second reader, which keeps writers out until its TTL. Both are bounded by the TTL, as a
//!   dropped acquire is (`# Cancel safety`).
//! - **Extends and releases are not acknowledged by replicas.** `min_replicas` adds `WAIT` to
//!   acquires only: after a failover to a replica that had not received an extend, an
//!   acknowledged lease expires at the TTL of its acquire or of the last extend that replica
//!   got, earlier than its holder's deadline (the holder learns at its next extend, and only
//!   the fencing token keeps its writes out meanwhile); a release the replica had not received
//!   is undone, and the lease then blocks the key until that same expiry. Tokens are not
//!   affected: they are written by acquires, which `WAIT` covers.
//!
//! # Shared leases and permits
//! [`RedisStore`] keeps all three [`Mode`]s (`Capabilities::shared` and `permits`; Redlock does
//! not, see `# Redlock`). Each operation is one Lua script, atomic on the server.
//! - **Layout.** While a key is held in shared or permit mode, its lock `{prefix}{k}:lock`
//!   (in `layout=plain`, the key itself) holds the mode's *tag*, `fencelock:shared` or
//!   `fencelock:permits:L`, never an owner id, with a `PX` expiry just past the last holder's.
//!   The holders are the sorted set `{prefix}{k}:holders`: one member `owner:token:slot` per
//!   lease (slot `-` when shared), scored by its expiry in server µs, the set expiring with the
//!   tag. Exclusive requests that wait are marked in the sorted set `{prefix}{k}:writers` (a
//!   random id per wait, scored by the mark's expiry, the set expiring with its last mark).
//!   Every script reads the server's `TIME` and drops expired holders and marks first; the
//!   lock is the truth, so holders found without their tag hold nothing.
//! - **Exclusion.** Since the tag is in the lock, the exclusive scripts are unchanged: `SET NX`
//!   refuses a key held by readers or permits, and release and extend compare the owner id,
//!   which a tag never equals. A shared or permit request is refused while the lock holds an
//!   owner id (an exclusive holder, or in `layout=plain` a peer client) or the other mode's tag.
//! - **Acquire** (shared or permit) mints its token from the key's one fence, exactly as the
//!   exclusive acquire does, so tokens grow across all modes. A permit takes the lowest slot
//!   `0..L` no live holder has ([`Lease::slot`]). The limit is the tag's: while any permit of
//!   the key lives, a request with another limit fails with [`Error::LimitMismatch`]; once the
//!   last permit is released or expired, the tag is gone and any limit may be set. A permit
//!   waiter sleeps until the earliest holder's expiry (capped at [`WAIT_CAP`]).
//! - **Release and extend** compare owner *and* token (the member is built from the lease) and
//!   act only on a live holder under its mode's tag; extend never recreates one. A release
//!   re-times the tag to the last holder left, or deletes tag and set, and publishes on the
//!   key's channel, as the exclusive release does, so every kind of waiter is woken by it.
//! - **Writers do not starve.** An exclusive [`acquire`](fencelock_core::Acquire::acquire) or
//!   `acquire_as` that finds the key held marks itself in the writers set from its second
//!   attempt on (the first is the plain exclusive script, so an uncontended acquire costs what
//!   it did). Each attempt refreshes the mark for one second; the grant removes it in the same
//!   script, a waiter that times out removes it before it returns (and wakes the key's
//!   waiters), and a dropped waiter's mark is removed by a spawned task, or expires within a
//!   second of its last refresh if that task cannot run. New shared requests are refused while
//!   any mark lives, so readers already holding drain and the writer gets the key; readers
//!   waiting meanwhile are woken by its release. Permits are not held back by marks (as in
//!   the memory store). A mark is written under `pcall`: a user without the sorted-set rights
//!   still waits for exclusive locks, unmarked (readers may then overtake it), and the handle
//!   logs one warning.
//! - **Status** reports [`KeyStatus::Shared`] with the mode, the count and every holder's owner,
//!   token, slot and remaining time; a key held exclusively is read as before. **Evict** deletes
//!   the lock (or tag) and the holders set, never the fence, and wakes the waiters.
//! - **Per-key state.** Tag, holders and marks all expire with what they record: a key no one
//!   holds in a mode leaves only its fence behind.
//! - **Cost.** The exclusive release and extend scripts are the ones from before modes existed,
//!   and the exclusive acquire names the same two keys (it mints as every acquire does, see
//!   `# Per-key state`): one round trip each. Evict and status name one more key
//!   (status reads it only when it finds a tag). A shared or permit acquire reads `TIME`, the
//!   lock, the holders (`ZRANGE` over all of them for a permit's slot, at most
//!   [`MAX_PERMITS`](fencelock_core::MAX_PERMITS)), and writes fence, holders and tag.
//!
//! # Eviction
//! A lock key carries a TTL. With `maxmemory` set and any `maxmemory-policy` but
//! `noeviction` (managed Redis often defaults to `volatile-lru`; `allkeys-*` policies evict
//! any key), memory pressure can evict a held lock: the next acquirer gets the key while the
//! first holder's local deadline is still ahead, and the first learns it only at its next
//! extend. So [`RedisStore::connect`] reads both settings and refuses a server that may evict
//! with a non-retryable [`Error::Store`] naming them, whose source is an [`EvictionRisk`]
//! (not [`Error::InvalidInput`]: the URL is well-formed, the server's configuration is what
//! must change, and only asking the server shows it). A way out, knowingly:
//! `allow_eviction=true` in the URL skips the check.
//! - The settings come from `CONFIG GET maxmemory*`; where `CONFIG` is renamed, disabled or
//!   not in the user's ACL (common on managed services), from `INFO memory`. If neither is
//!   allowed, the store goes on: it logs one `tracing` warning per handle and
//!   [`RedisStore::eviction_check`] answers [`EvictionCheck::Unknown`] (`lockctl status`
//!   prints it).
//! - [`RedisStore::connect_lazy`] runs the check before its first operation reaches the
//!   server; while the server may evict, every operation fails with that error and sends
//!   nothing else. A refusal is not remembered: a server reconfigured meanwhile passes the
//!   next check. A check that let the store go on is not repeated: the settings are read
//!   once per handle, so a later `CONFIG SET` goes unnoticed.
//! - [`RedlockStore::connect`] checks every node and refuses the store naming the node that
//!   may evict; it waits for each node's answer (up to the connect timeout plus the command
//!   timeout). A node that was down is checked at its first answer and counts as failed until
//!   it passes, so it never holds a lock.
//! - With `noeviction`, a full server refuses new locks with `OOM` (retryable) and keeps every
//!   lock it holds.
//!
//! # Per-key state
//! A key no one holds leaves one Redis key behind: its fence (about 70 bytes). Each acquire
//! sets the fence to expire one retention window later (`retention`, 7 days by default, which
//! must exceed `max_ttl`, 24 h by default), so the keys a store holds are the keys locked
//! within the window, never every key ever locked. The lock key expires with its TTL and the
//! release channel holds nothing. Fences written by builds before this one have no expiry
//! until their key is locked again. `lockctl stats` counts the keys under the prefix.
//!
//! Each acquire writes the token and the fence's expiry in one command, `SET fence token PX
//! retention`: from Redis 6.2 on it is `SET fence now PX retention GET`, which also answers
//! the fence it replaced, followed by a second `SET` of fence + 1 only when that fence was at
//! or ahead of the clock; older servers refuse `GET` there and the script reads the fence
//! first. Against the plainest fenced acquire (`SET NX PX`, then `INCR` of a counter that
//! never expires and does not survive losing it), ours adds `TIME` and writes the fence with
//! a `SET` and its expiry where that one runs `INCR`; the example bench prints both.
//!
//! A key locked again after its fence expired still gets a greater token. The argument, on
//! one server: a token is `max(fence + 1, TIME µs)`, so the fence never runs ahead of the
//! server's clock by more than `E`, the grants that fell within one microsecond (each needs a
//! release in between: in practice none). The fence expires only once that clock read at
//! least `w + retention`, `w` being its last write, and expiry and `TIME` read the same clock;
//! the next acquire mints at least the clock, which is past the old fence by
//! `retention − E`. **Clock assumption** (the one the floor already makes): the server's clock
//! does not step backwards by more than the retention window (minus `E`) between a fence's
//! expiry and the key's next acquire. A failover to a replica whose clock is behind is the
//! caveat the Redis table already names.
//!
//! So on one server any window the URL accepts is enough: the mint has no granule (µs) and
//! one clock both mints and expires, so `retention > max_ttl` is the only rule, and no sound
//! window is refused. The same holds on a **Redis Cluster** for a key that stays on its slot
//! master, and across a failover to a replica that has the fence (Redis 7 replicates the
//! expiry as an absolute time, the promoted replica's mint reads the same clock that expires
//! it). A **resharding** that moves the slot carries the fence with its *remaining* time to a
//! master whose clock may be behind by `s`: the margin shrinks to `retention − s`, which any
//! window of seconds covers.
//!
//! **On Redlock** a node's fence may hold a token from another node's clock, ahead of its own
//! by up to the skew `S` (a raise), and its mint rounds its clock down to a granule `G` (2^18
//! µs). The fence expires once the node's clock read at least `w + retention`, `w` its last
//! write (a raise refreshes the expiry too); the next mint there is at least that reading
//! rounded down, so above the old fence (at most `w + S` plus `E`) once `retention ≥ G + S`
//! (plus 1 ms: the expiry counts from the script's start, the mint from its `TIME`). A lease's
//! lifetime only adds margin (a key's next lease on a node comes after the last one's lock
//! there ended), so `max_ttl` is not part of it; the window must exceed it anyway. A shorter
//! window lets a node whose fence expired within the granule mint the token it minted before
//! (issue 32: `retention=150ms&max_ttl=100ms` handed one token out twice), so `redlock://`
//! refuses any window below `G + max_skew + 1 ms`, with `max_skew` (default 1 s, the
//! deployment's promise about its nodes' clocks) a URL option: see [`RedlockConfig`]. The
//! argument is modelled in the tests (`floor_model.rs`: the Lua mint checked against a Rust
//! mirror on a real server, property tests at the bound, and a history 3 ms below it that
//! hands a token out twice). A Redlock wait also leaves, on each node, one small
//! request key for 10 s after it ends (none when its first round took the lock), and its
//! queue's two sorted sets expire 2.5 s after the last entry. `cargo test -p fencelock-redis
//! --all-features --test retention` locks 10,000 distinct keys (`FENCELOCK_KEYS=100000` for more) with a short
//! window and counts the keys back to none.
//!
//! # Next to other Redis lock clients: `layout=plain`
//! With [`Layout::Plain`] (URL option `layout=plain`, [`RedisStore`] only) the lock on `key`
//! is the Redis key `key` itself, holding the owner id: taken by `SET key owner NX PX ttl`,
//! released by compare-and-delete, extended by compare-and-`PEXPIRE`. That is what
//! single-server clients such as redis-py's `Lock`, redsync and node-redlock do (each with its
//! own random value), so fencelock and those clients exclude each other on the same key, both
//! ways. The fence keeps fencelock's name, `{prefix}{key}:fence`, and is still minted by the
//! acquire script, atomically with the `SET NX`. It is the same fence as the default layout's,
//! so tokens keep growing when a key's fencelock clients switch layouts; but the two layouts
//! lock different Redis keys and do not exclude each other, so switch every fencelock client
//! of a key at once.
//!
//! **Fencing with peer writers.** Peers mint no tokens. A resource that checks fencelock's
//! tokens still refuses a stale fencelock holder once a later fencelock holder wrote (its token
//! is greater, whoever held the key in between). It cannot refuse a peer's write (it carries no
//! token), and it cannot refuse a stale fencelock write that follows a peer's: fencelock
//! holder `A` pauses past its TTL, peer `P` takes the key and writes, `A` resumes and writes
//! with its old token, which is still the greatest the resource has seen, so the resource
//! accepts it over `P`'s. Fencing
//! orders fencelock's writers among themselves; a resource written by peers too is protected
//! only as far as the peers' own locks protect it, until they move to fencelock.
//!
//! **Waiting.** Peers publish nothing when they release, so a fencelock waiter sees their
//! release only when it tries again: when the holder's `PTTL` runs out, and at least every
//! [`WAIT_CAP`] (250 ms) meanwhile. A peer's release is seen within 250 ms plus one round
//! trip; fencelock's own releases still wake waiters at once. [`Capabilities`] therefore says
//! `notified_wait: false` in this layout. `cargo test -p fencelock-redis --all-features --test
//! peer_clients` runs redis-py's `Lock` against fencelock and prints the wake-up delay.
//!
//! **Scope.** One server. `redlock://` has no layout option: the peers' multi-master variants
//! use their own quorum and timing, which no test here checks. On a Redis Cluster the lock and
//! its fence would no longer share a hash tag, so the acquire script would span two slots.
//!
//! # Cancel safety
//! Every operation is one script on the shared connection. A future dropped after its script
//! was sent leaves the script to run: a dropped acquire may leave a lease nobody knows of,
//! which blocks the key until its TTL. A dropped waiter between attempts holds nothing and
//! gives up its subscription. See each method's `# Cancel safety`.
//!
//! # Operator actions
//! [`LockStore::evict`] deletes a key's lock behind its holder's back (never its fence), with
//! every shared or permit holder of the key, and wakes the waiters; the holders find out at
//! their next extend or release.
//!
//! # Server requirements
//! Redis 5 or newer (scripts that read `TIME` and then write rely on effect replication,
//! the default since 5), Redis 6 or newer for an ACL user name in the URL; Valkey works the
//! same (from 6.2 an acquire writes the fence with one `SET … GET`, before it with `GET` and
//! `SET`). The user needs `EVALSHA`, `SCRIPT LOAD`, `SUBSCRIBE` and `PING`, the commands the
//! scripts call (`SET`, `GET`, `DEL`, `PEXPIRE`, `PTTL`, `TIME`, `PUBLISH`), the
//! keys and channels under the prefix, and for the eviction check `CONFIG GET` (ACL
//! `+config|get`) or else `INFO` (`+info`); with neither the store warns and goes on, and
//! with `allow_eviction=true` neither is sent. Shared leases and permits, and the marks of
//! waiting writers, also need the sorted-set commands `ZADD`, `ZREM`, `ZRANGE`,
//! `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE`, `ZCARD` and `ZSCORE` on the same keys
//! (`+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zcard +zscore`); a user that only
//! takes exclusive locks can do without them (its waits go unmarked, with one warning, and
//! status reads the holders only of a key held in a mode). Each handle opens one command
//! connection and, once something waits, one pub/sub connection.
//!
//! # The URL
//! `redis://[[user]:password@]host[:port][/db][?prefix=…&layout=…&connect_timeout=…&command_timeout=…&allow_eviction=…&retention=…&max_ttl=…]`,
//! and `rediss://` for TLS with the crate feature `tls`: see [`RedisConfig`]. Redlock:
//! `redlock://[[user]:password@]host:port,host:port,host:port[/db][?…]`, see
//! [`RedlockConfig`].
//!
//! # Redlock
//! [`RedlockStore`] runs the same scripts on N ≥ 3 independent masters (no replication
//! between them) from `redlock://host:port,host:port,host:port[/db][?…]` (see
//! [`RedlockConfig`]). With `q = N/2 + 1`:
//! - **Acquire** sends the acquire script to every node at once, each under the per-node
//!   timeout (`command_timeout`, capped at the TTL). It succeeds when `q` nodes granted and
//!   the lease still has validity: `TTL − elapsed − drift`, with drift `TTL × 0.01 + 2 ms` by
//!   default and elapsed counted from a clock reading taken before the first request. On
//!   failure it releases on every node that granted, failed or has not answered, and
//!   retries up to `retry_count` times after a random delay up to `retry_jitter`. Errors
//!   from a minority of nodes are tolerated; too many give the retryable
//!   [`Error::Unavailable`] listing each node's answer or reason. Outcomes are decided as soon
//!   as they are known, so a frozen minority costs nothing; its requests still run in the
//!   background up to their timeout.
//! - **Release** goes to every node: `Released` once `q` nodes deleted this owner's lock,
//!   `Lost` once it cannot have been held by `q`. **Extend** needs `q` nodes to extend within
//!   the validity. **Waiting** queues on every node in ticket order, and a release hands the
//!   key to the queue's head itself, so a handoff takes one round trip from the releaser
//!   (below); the waiter listens on a channel of its own on every node (each node's one
//!   pub/sub connection per handle) and makes its own round when woken without a grant, when
//!   the holder's TTL runs out, and at least every [`WAIT_CAP`] like the single-node store.
//!   [`LockStore::evict`] deletes the lock on every node.
//!
//! **Fencing tokens.** Each node mints in its acquire script as above, but from a coarse
//! clock: `max(fence + 1, TIME µs rounded down to a multiple of 2^18 µs)` (about 0.26 s),
//! written to its fence. A lease's token `t` is the largest its granting nodes minted, and the
//! lease is handed out only once it has **witnesses**: a quorum of nodes whose fence went from
//! below `t` to `t` by a write made while the node's lock held this lease.
//! - If a quorum of the granting nodes minted `t` itself, they are the witnesses (the mint
//!   wrote `t` over a smaller fence inside the grant's own script) and nothing more is sent:
//!   one round trip, as in plain Redlock. Nodes whose clocks read the same granule and whose
//!   fences agree mint the same token, which is why the clock is coarse: this is the usual
//!   case, and a key locked again within the granule mints `fence + 1` everywhere.
//! - Otherwise the granting nodes that minted less are **raised** to `t`, by a script that
//!   writes only while the node's lock holds this owner, and only from below; a fence found at
//!   or beyond `t` (only a writer that does not check the owner can put it there) makes the
//!   next round ask every granting node for one more than the highest fence found.
//!
//! Take a lease `A` with token `a`, handed out, and any lease `B` handed out after it. Their
//! witnesses are two quorums, so they share a node `m`, and both held `m`'s lock, at different
//! times. `A`'s lock there came first: otherwise it was granted after `B`'s ended, which is
//! after `B` was handed out (a lease's locks stay in place until then: its validity), which is
//! after `A` was, yet `A`'s lock on `m` was granted before `A` was handed out. So `A`'s write
//! of a fence `≥ a` on `m` came before `B`'s lock there, and `B`'s write on `m` took `b` from
//! below a fence that only grows: `b > a`. This holds whichever majorities grant, whatever the
//! nodes' clocks read, and also for attempts whose requests were sent while `A` was still being
//! acquired. The owner check is what makes skipping the raise sound: a raise that could write
//! a node it does not hold could lift `m`'s fence past `b` after `B`'s mint there, hand `A` out
//! with `a > b`, and `B`, its witness on `m` being the earlier mint, would follow with a smaller
//! token. (Builds before the owner check raised any node: stop them before running this one on
//! the same nodes; fences are kept, so tokens keep growing across the switch.)
//!
//! A lease a release handed over (*Waiting in order*, below) fits the same argument: each
//! node that granted it minted its token in the release script that set its lock, exactly as
//! an acquire script does, so those nodes are its witnesses when a quorum of them minted the
//! largest token, and otherwise the raise runs as above, as that lease's owner.
//!
//! The coarse clock costs the per-key state argument one granule: a node's fence expiring
//! within a granule plus the skew of its last write could let its next mint repeat a token,
//! so the retention window must be at least a granule plus `max_skew` plus 1 ms (1264 ms with
//! the default skew of 1 s), and shorter windows are refused when the URL is read
//! (`# Per-key state`).
//!
//! **Waiting in order.** A waiting acquire enters a per-key queue on every node, with one
//! ticket for all of them (its client's clock when the wait began; ties by a random waiter id),
//! and refreshes its entry at every round (it lapses 1.5 s after the last one). While a node's
//! queue holds a live entry, it grants only to the head, so the nodes agree on whom to grant
//! next and waiters do not split the vote. A request that does not wait (`try_acquire`) is
//! `Busy` while waiters are queued. The order follows the clients' clocks, so the queue is not
//! declared fair. The queue needs `EXISTS` and the sorted-set commands of `# Server
//! requirements`; its scripts call them under `pcall`, so a user without them still locks,
//! its waits unordered.
//!
//! **Handoff in one round.** Each round of a waiter also leaves a *request* on every node
//! (`{prefix}{key}:request:<waiter id>`: the round's number, an owner id, the TTL), and is
//! itself made as the owner the previous round requested. A release (or a withdrawal) that
//! frees a node's lock hands it to the queue's head there, when the head's request is there
//! and its entry was refreshed within the last 0.75 s: the script sets the lock to the
//! requested owner for the requested TTL, mints a token as an acquire does, removes the
//! entry, and publishes `g:<token>:<owner>` on the head's own channel
//! (`{prefix}{key}:released:<waiter id>`). Otherwise it only wakes the head there. The
//! waiter takes the lease as soon as a quorum of nodes granted its current request, without
//! a round of its own: the handoff costs one fan-out, the release. The lease's validity
//! counts from the moment the round that left the request was sent (each node granted after
//! reading it, so each lock there lasts the TTL from after that moment); with less than half
//! the TTL left that way, the waiter makes a round instead, which finds the grants (a lock
//! held by the round's own owner), refreshes their expiry and mints again. A waiter woken
//! by a quorum of nodes without a quorum of grants makes a round too, as do waiters of
//! builds that leave no request. Other waiters are neither woken nor granted.
//! - A wait that ends without a lease (timeout, error, dropped future) withdraws its entries
//!   on every node and deletes the grants it did not collect (grants on a minority, from a
//!   release cut off part-way: the owner the node's request key names, or its last two), then
//!   hands each freed node on. A lease taken from grants withdraws from the nodes outside its
//!   quorum (deleting a grant made there meanwhile: it does not need it).
//! - Every round carries its number, and a node that holds a newer request of the same wait,
//!   a grant of it or its withdrawal (kept 10 s) ignores an older round: a round held up by a
//!   stopped node or a reconnection cannot queue its waiter again after the wait ended. A
//!   round also takes over a grant an earlier request of its wait got on that node (one the
//!   waiter missed), so no grant of a wait still waiting is left for the TTL.
//! - **Cost:** a waiter whose process died is granted the key by a release within 0.75 s of
//!   its last round, and that lock then stays until its TTL, as a lease nobody collects (an
//!   acquire dropped mid-round can leave one too); after 0.75 s it is only woken, and it holds
//!   the head of the queue until its entry lapses (1.5 s).
//!
//! **Assumptions.**
//! - No node loses its data while it is in a majority that raised a token, unless it stays
//!   down longer than the longest TTL before rejoining (the classic Redlock caveat: a node
//!   that comes back at once may grant a lock it had granted before, and may be the only node
//!   shared with the witnesses). A node that rejoined empty still mints from its clock: every
//!   earlier token was some node's clock reading at its grant, rounded down to the granule
//!   (or a counter just past one), so after a downtime longer than the skew between the
//!   nodes' clocks plus a granule (0.26 s) the floor alone is past it. That is why
//!   killed-and-restarted minorities keep tokens growing in the fault tests.
//! - A lease's locks are still in place on its granting nodes until it is handed out (its
//!   validity, checked after the raise, says so within the drift margin).
//! - As for every Redlock: the holder's clock runs at about the nodes' rate (the drift
//!   margin covers 1% by default), and a holder that pauses past its validity must be stopped
//!   by the fencing token at the resource.
//!
//! **No semaphores, no shared leases.** [`RedlockStore`] declares neither
//! (`Capabilities::shared` and `permits` are false) and refuses both modes with
//! [`Error::Unsupported`](fencelock_core::Error::Unsupported). Running the single-node
//! semaphore on every node and counting a majority would not bound the permits. Redlock's
//! argument is pairwise: two leases that exclude each other were granted by majorities that
//! share a node, and that node refused the second. A semaphore's bound is not pairwise: a node
//! allows `L` permits, so the shared node holds both, and each permit may be granted by a
//! different majority. With 3 nodes `A, B, C` and `L = 2`, permits granted on `{A, B}`,
//! `{A, C}` and `{B, C}` leave each node holding exactly two, within its limit, while three
//! permits are out. In general `N` nodes of `L` permits each, with majorities of `q`, let up to
//! `⌊N·L/q⌋` permits be held at once (each permit on `q` consecutive nodes, round the ring),
//! which is more than `L` for every `L ≥ 2` on an odd number of nodes (5 nodes, `L = 3`: 5
//! permits), and nodes that lose their data push it further. Only `L = 1`, a mutex, is
//! bounded that way. A bounded Redlock semaphore would
//! need another design, such as `L` separate Redlock mutexes, one per slot, with an acquire
//! that may try every slot; this crate does not implement it. Shared leases are pairwise (a
//! reader and a writer would meet on a shared node), so a quorum reader-writer lock is possible
//! in principle, but it would need the writers' marks and the fence raise on a quorum as well;
//! it is not implemented either. Use [`RedisStore`] on one server, etcd or PostgreSQL for them.
//!
//! [`Error::Unavailable`]: fencelock_core::Error::Unavailable
//! [`Error::Store`]: fencelock_core::Error::Store
//! [`Error::InvalidInput`]: fencelock_core::Error::InvalidInput
//! [`Capabilities`]: fencelock_core::Capabilities
//! [`Mode`]: fencelock_core::Mode
//! [`Lease::slot`]: fencelock_core::Lease::slot
//! [`Error::LimitMismatch`]: fencelock_core::Error::LimitMismatch
//! [`KeyStatus::Shared`]: fencelock_core::KeyStatus::Shared
//! [`LockStore::evict`]: fencelock_core::LockStore::evict
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): config, error, keys, script, eviction, subscriber, store, stats, redlock (config, quorum, fanout, store), descriptor.
mod cluster;
mod config;
mod descriptor;
mod error;
mod eviction;
#[cfg(test)]
mod floor_model;
mod keys;
mod redlock;
mod script;
mod stats;
mod store;
mod subscriber;

pub use config::{
    Layout, RedisConfig, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    MAX_PREFIX_LEN,
};
pub use descriptor::{REDIS, REDIS_CLUSTER, REDLOCK};
pub use eviction::{EvictionCheck, EvictionRisk, EvictionSettings};
pub use redlock::{QuorumError, RedlockConfig, RedlockStore};
pub use store::{RedisStore, WAIT_CAP};
