//! The scripts only Redlock runs on each node: an acquire that mints from a coarse clock and
//! keeps a per-key waiter queue, a raise that only touches a node this owner holds, and the
//! withdrawal of a waiter. The release, extend, evict and status scripts are the single-node
//! store's (`crate::script`).

use std::sync::LazyLock;
use std::time::Duration;

use fencelock_core::raw::ttl::whole_millis;
use fencelock_core::{Error, OwnerId, Result};
use redis::aio::ConnectionLike;

use crate::error::script_error;
use crate::keys::KeyNames;
use crate::script::{evalsha, owner_hex, run_script, Attempt, Lua};

/// How long a waiter's queue entry lives without a refresh. A waiter refreshes it at every
/// round, at least every [`WAIT_CAP`](crate::store::WAIT_CAP) (250 ms) plus one round, so it
/// outlives a live waiter's nap with room to spare; a waiter that vanished without
/// withdrawing (its process died) holds the queue's head at most this long.
pub(crate) const QUEUE_MARK: Duration = Duration::from_millis(1_500);

/// Lua setting `token` to `max(fence + 1, TIME µs rounded down to GRANULE)` for the clock
/// reading `t`, written to the fence (`KEYS[2]`) with its retention expiry (`ARGV[3]`; `SET …
/// GET` from Redis 6.2, GET then SET before). Run only while the lock holds the owner it mints
/// for. Inline, not a Lua function: a closure made at every call costs the hot paths. The
/// code around it declares `local token` first and has the clock reading `t` in scope.
macro_rules! mint_lua {
    () => {
        r"
  local now = t[1] * 1000000 + t[2]
  token = now - now % 262144
  local old = redis.pcall('SET', KEYS[2], token, 'PX', ARGV[3], 'GET')
  if type(old) == 'table' then
    old = redis.call('GET', KEYS[2])
    if not (old and tonumber(old) >= token) then
      redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
    end
  end
  if old and tonumber(old) >= token then
    token = tonumber(old) + 1
    redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
  end
"
    };
}

/// Lua dropping the queue's lapsed entries (`KEYS[3]`, their expiries `KEYS[4]`, server ms
/// `ms`), then reading its head into `head`.
macro_rules! queue_head_lua {
    () => {
        r"
  local gone = redis.pcall('ZRANGEBYSCORE', KEYS[4], '-inf', ms, 'LIMIT', 0, 100)
  if #gone > 0 then
    redis.pcall('ZREM', KEYS[3], unpack(gone))
    redis.pcall('ZREM', KEYS[4], unpack(gone))
  end
  local head = redis.pcall('ZRANGE', KEYS[3], 0, 0)
"
    };
}

/// How long a node remembers that a waiter's request was granted or withdrawn: a round of that
/// waiter arriving later than that (sent before, but held up by a stopped node or a
/// reconnection) could queue it again, and a release grant it a lock nobody collects until
/// the TTL. One small key per node and wait (none for a wait granted by its first round)
/// lives this long. Written into the scripts by `stale_guard_ms!`.
// The scripts carry it as a literal; a test checks they agree.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const STALE_GUARD: Duration = Duration::from_secs(10);

/// [`STALE_GUARD`] in ms, as the scripts have it.
macro_rules! stale_guard_ms {
    () => {
        "10000"
    };
}

/// How recently a waiter must have refreshed its entry for a release to grant it the lock: a
/// live waiter refreshes it at least every [`WAIT_CAP`](crate::store::WAIT_CAP) (250 ms) plus
/// one round. A waiter whose process died is granted the key (which then stays held until the
/// TTL) only by a release within this long of its last round; after that it is only woken, as
/// a client without requests is, until its entry lapses ([`QUEUE_MARK`]).
// The scripts carry it as a literal; a test checks they agree.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const GRANT_FRESH: Duration = Duration::from_millis(750);

/// [`QUEUE_MARK`] − [`GRANT_FRESH`] in ms, as the scripts have it: the least time to its lapse
/// an entry a release grants has.
macro_rules! fresh_lapse_ms {
    () => {
        "750"
    };
}

/// The acquire on one node, with `$request` (Lua appended to a waiter's request, or nothing),
/// `$takeover` (run as a waiter's round takes over an earlier grant to its wait) and `$label`
/// (run on a grant before the mint).
macro_rules! acquire_lua {
    ($request:literal, $takeover:literal, $label:literal) => {
        concat!(
            r"
local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000)
local waiter = ARGV[4] or ''
local mine = false
if waiter ~= '' then
  local before = redis.call('GET', KEYS[5])
  local known
  if before then
    local last, owner = string.match(before, '^(%d+):(%x*)')
    last = tonumber(last or '')
    if not last or last >= tonumber(ARGV[8]) then
      return {0, redis.call('PTTL', KEYS[1]), 1}
    end
    if owner ~= '' then
      known = owner
    end
  end
  redis.pcall('ZADD', KEYS[3], ARGV[5], waiter)
  redis.pcall('ZADD', KEYS[4], ms + tonumber(ARGV[6]), waiter)
  redis.pcall('PEXPIRE', KEYS[3], tonumber(ARGV[6]) + 1000)
  redis.pcall('PEXPIRE', KEYS[4], tonumber(ARGV[6]) + 1000)
  redis.call('SET', KEYS[5], ARGV[8] .. ':' .. ARGV[7] .. ':' .. ARGV[2]",
            $request,
            r", 'PX', ARGV[6])
  local holder = redis.call('GET', KEYS[1])
  if holder and (holder == ARGV[1] or holder == known) then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
",
            $takeover,
            r"    mine = true
  end
end
if not mine then
  local queued = 0
  if redis.pcall('EXISTS', KEYS[4]) == 1 then
",
            queue_head_lua!(),
            r"
    if head[1] and head[1] ~= waiter then
      queued = 1
    end
  end
  if queued == 1 or not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if waiter ~= '' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
      return {0, redis.call('PTTL', KEYS[1]), queued}
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
end
if waiter ~= '' then
  redis.pcall('ZREM', KEYS[3], waiter)
  redis.pcall('ZREM', KEYS[4], waiter)
  if ARGV[8] == '1' then
    redis.call('DEL', KEYS[5])
  else
    redis.call('SET', KEYS[5], ARGV[8] .. ':' .. ARGV[1] .. ':', 'PX', ",
            stale_guard_ms!(),
            r")
  end
end
",
            $label,
            r"local token
",
            mint_lua!(),
            r"
return token
"
        )
    };
}

/// Acquire on one node. KEYS: lock, fence, queue (waiter ids scored by ticket), expiries
/// (waiter ids scored by the server ms their entry lapses), and for a waiter its request.
/// ARGV: owner, ttl ms, retention ms, and for a waiter: its id, ticket, mark ms, next owner,
/// the round's number in the wait.
///
/// The queue's commands run under `pcall`: a user without `EXISTS` and the sorted-set rights
/// still locks, its waits unordered. A waiting request first checks its request key: a
/// request or grant from this round or a later one, or a withdrawal (`w`), means this round
/// is stale (sent before, arrived late): it changes nothing and answers `{0, pttl, 1}`.
/// Otherwise it enters (or refreshes) its entry, and its **request**
/// (`<round>:<next owner>:<ttl ms>`, lapsing with the entry): what a release grants the waiter
/// when it heads the queue (`grant_head_lua!`). A lock held by this round's owner, or by the
/// owner the key named before (an earlier round's request or grant: a grant this wait never
/// collected, or a grant whose release was lost), is this wait's: it becomes this round's
/// grant, set to this round's owner for the TTL from now, its token minted again. No lease
/// holds such a lock: a wait that took a lease makes no more rounds. While the queue holds a
/// live entry, only its head (lowest ticket, then lowest id: every node orders the same
/// entries the same way) may take the lock: anyone else is answered `{0, pttl, 1}`. A request
/// that does not wait and finds the lock holding its own owner (a fresh id per round) is the
/// same request run again, a resend after an I/O error: it takes its first run's grant over as
/// a waiter's round does, queue or not, rather than counting as held. A grant
/// is `SET lock owner NX PX ttl`, then the minted token (`mint_lua!`); a waiter's grant also
/// removes its entry and marks its request granted (`<round>:<owner>:`, kept
/// [`STALE_GUARD`]; deleted for a first round, which no older round can follow), so no
/// release grants it again. A held key answers `{0, pttl, 0}`. Atomic: one script.
pub(crate) const ACQUIRE_LUA: &str = acquire_lua!("", "", "");

/// [`ACQUIRE_LUA`] for a labelled request. The label key (named by the owner) is the last of
/// KEYS and the label the last of ARGV (ARGV[4] is then the waiter id or empty, so a request
/// that does not wait sends `''` there): a grant sets the label key to the label for the TTL;
/// a waiter's request carries the label after its TTL (`<round>:<owner>:<ttl ms>:<label>`),
/// so a release that grants the request labels the holder too (`grant_head_lua!`); a round
/// that takes over a grant made to its wait's earlier owner deletes that owner's label key.
/// Atomic: the label is written by the script that grants. A separate script, so an
/// unlabelled acquire runs exactly what it did before labels.
pub(crate) const ACQUIRE_LABELLED_LUA: &str = acquire_lua!(
    " .. ':' .. ARGV[#ARGV]",
    "    if holder ~= ARGV[1] then\n      redis.call('DEL', string.sub(KEYS[#KEYS], 1, -33) .. holder)\n    end\n",
    "redis.call('SET', KEYS[#KEYS], ARGV[#ARGV], 'PX', ARGV[2])\n"
);

/// Raise on one node this owner holds: if the lock (`KEYS[1]`) holds `ARGV[1]`, set the fence
/// (`KEYS[2]`) to `ARGV[2]` if it is below, else report it; either way the fence expires `ARGV[3]` ms
/// later. Answers -1 when the lock is not this owner's (expired, evicted): nothing is written
/// then. Atomic: the check, the read and the write are one script.
pub(crate) const RAISE_LUA: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 0
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return fence
";

/// Lua handing a free lock (`KEYS[1]`) to the head of the queue (`KEYS[3]`, entries' expiries
/// `KEYS[4]`), after dropping lapsed entries: when the head left a request (the key
/// `<stem>request:<waiter id>` next to `<stem>queue`, holding `<round>:<owner>:<ttl ms>`, then
/// `:<label>` for a labelled waiter) and refreshed its entry within [`GRANT_FRESH`], the lock is
/// set to that owner for that TTL (and for a labelled request the label key
/// `<stem>label:<owner>` to the label, in the same script, so the grant is labelled), a token
/// minted (`mint_lua!`, retention `ARGV[3]`), the head's entry removed, its request
/// marked granted (`<round>:<owner>:`, kept [`STALE_GUARD`], so a late round of the same
/// waiter is known as stale), and `g:<token>:<owner>` published on the head's own channel,
/// `ARGV[2]:<waiter id>`; otherwise (no request: a client without them; an entry not
/// refreshed lately; or the lock is held) the head is only woken there, with an empty message,
/// and makes a round.
macro_rules! grant_head_lua {
    () => {
        concat!(
            r"
if redis.pcall('EXISTS', KEYS[4]) == 1 then
  local t = redis.call('TIME')
  local ms = t[1] * 1000 + math.floor(t[2] / 1000)
",
            queue_head_lua!(),
            r"
  local id = head[1]
  if id then
    local message = ''
    local requests = string.sub(KEYS[3], 1, -6) .. 'request:'
    local request = redis.call('GET', requests .. id)
    local lapses = tonumber(redis.pcall('ZSCORE', KEYS[4], id)) or 0
    local round, owner, ttl, label
    if request and lapses - ms >= ",
            fresh_lapse_ms!(),
            r" then
      round, owner, ttl, label = string.match(request, '^(%d+):(%x+):(%d+):?(.*)$')
    end
    if owner then
      local set = redis.pcall('SET', KEYS[1], owner, 'NX', 'PX', ttl)
      if type(set) == 'table' and set.ok then
        local token
",
            mint_lua!(),
            r"
        if label ~= '' then
          redis.call('SET', string.sub(KEYS[3], 1, -6) .. 'label:' .. owner, label, 'PX', ttl)
        end
        message = 'g:' .. string.format('%d', token) .. ':' .. owner
        redis.pcall('ZREM', KEYS[3], id)
        redis.pcall('ZREM', KEYS[4], id)
        redis.call('SET', requests .. id, round .. ':' .. owner .. ':', 'PX', ",
            stale_guard_ms!(),
            r")
      end
    end
    redis.call('PUBLISH', ARGV[2] .. ':' .. id, message)
  end
end
"
        )
    };
}

/// Release on one node: delete the lock only if it still holds this owner, publish on the
/// key's channel (as the single-node release does), and hand the lock to the queue's head
/// (`grant_head_lua!`), so the next lease takes no round of its own. KEYS: lock, fence,
/// queue, expiries. ARGV: owner, channel, retention ms. Returns 1 if released, 0 if the lease
/// was already gone. Atomic: one script.
pub(crate) const RELEASE_LUA: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
",
    grant_head_lua!(),
    r"
return 1
"
);

/// [`RELEASE_LUA`] for a labelled lease: the holder's label key (`KEYS[5]`) goes with the lock,
/// before the queue's head is granted. Atomic: one script.
pub(crate) const RELEASE_LABELLED_LUA: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('PUBLISH', ARGV[2], '')
",
    grant_head_lua!(),
    r"
return 1
"
);

/// A waiter stops waiting: remove its entry, mark its request withdrawn (`w`, kept
/// [`STALE_GUARD`], so a late round of it changes nothing; the request key is `ARGV[4]`);
/// delete the lock if it holds the owner the request key named (the last round's request or
/// grant on this node), `ARGV[5]` or `ARGV[6]` (grants it will not collect; empty for none),
/// with that owner's label key (`<stem>label:<owner>`: a labelled request's grant has one);
/// then, if either was there, hand the lock to the queue's new head or wake it
/// (`grant_head_lua!`). KEYS: lock, fence, queue, expiries. ARGV: waiter id, channel,
/// retention ms, request key, two stale owners. Atomic: one script.
pub(crate) const WITHDRAW_LUA: &str = concat!(
    r"
redis.pcall('ZREM', KEYS[4], ARGV[1])
local was = redis.pcall('ZREM', KEYS[3], ARGV[1]) == 1
local known = string.match(redis.call('GET', ARGV[4]) or '', '^%d+:(%x+)')
redis.call('SET', ARGV[4], 'w', 'PX', ",
    stale_guard_ms!(),
    r")
local holder = redis.call('GET', KEYS[1])
if holder and (holder == known or holder == ARGV[5] or holder == ARGV[6]) then
  redis.call('DEL', KEYS[1], string.sub(KEYS[3], 1, -6) .. 'label:' .. holder)
  redis.call('PUBLISH', ARGV[2], '')
  was = true
end
if not was then
  return 0
end
",
    grant_head_lua!(),
    r"
return 1
"
);

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LUA));
static RAISE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RAISE_LUA));
static WITHDRAW: LazyLock<Lua> = LazyLock::new(|| Lua::new(WITHDRAW_LUA));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));
static ACQUIRE_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LABELLED_LUA));
static RELEASE_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LABELLED_LUA));

/// The names of one key on a Redlock node: the single-node store's, and the key's waiter
/// queue and its entries' expiries, under the same hash tag.
#[derive(Debug)]
pub(crate) struct RedlockNames {
    pub(crate) key: KeyNames,
    /// `{prefix}{{key}}:queue`: waiter ids scored by ticket.
    pub(crate) queue: String,
    /// `{prefix}{{key}}:queued`: waiter ids scored by the server ms their entry lapses.
    pub(crate) expiries: String,
    /// `{prefix}{{key}}:request:`, followed by a waiter id: that waiter's request,
    /// `<round>:<owner>:<ttl ms>`, what a release grants it when it heads the queue (or the
    /// marks `<round>:<owner>:` once granted and `w` once withdrawn).
    pub(crate) requests: String,
}

impl RedlockNames {
    pub(crate) fn new(key: KeyNames) -> Self {
        let stem = key.fence.strip_suffix("fence").unwrap_or(&key.fence);
        let (queue, expiries) = (format!("{stem}queue"), format!("{stem}queued"));
        let requests = format!("{stem}request:");
        RedlockNames {
            key,
            queue,
            expiries,
            requests,
        }
    }

    /// The key of `waiter`'s request.
    pub(crate) fn request(&self, waiter: OwnerId) -> String {
        let hex = owner_hex(waiter);
        let mut key = String::with_capacity(self.requests.len() + hex.len());
        key.push_str(&self.requests);
        key.push_str(std::str::from_utf8(&hex).unwrap_or_default());
        key
    }
}

/// A waiting request's place in the queue: its id and its ticket (the same on every node),
/// and the owner a release on a node grants it the lock as (its request there).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter {
    pub(crate) id: OwnerId,
    pub(crate) ticket: u64,
    pub(crate) next: OwnerId,
    /// The round's number in the wait, from 1: a node ignores a round older than the
    /// request it holds.
    pub(crate) round: u64,
}

/// What a Redlock acquire found on one node: the single-node [`Attempt`], and whether a
/// waiter queue kept this request out of a lock that may be free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeAttempt {
    pub(crate) attempt: Attempt,
    pub(crate) queued: bool,
}

/// Runs [`ACQUIRE_LUA`] on one connection, or [`ACQUIRE_LABELLED_LUA`] with a `label`.
pub(crate) async fn acquire_on<C: ConnectionLike>(
    conn: &mut C,
    names: &RedlockNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
    waiter: Option<Waiter>,
    label: Option<&str>,
) -> Result<NodeAttempt> {
    let (lua, source) = match label {
        None => (&*ACQUIRE, ACQUIRE_LUA),
        Some(_) => (&*ACQUIRE_LABELLED, ACQUIRE_LABELLED_LUA),
    };
    let labelled = usize::from(label.is_some());
    let mut bytes = names.key.lock.len() + names.key.fence.len() + 3 * names.queue.len() + 200;
    bytes += label.map_or(0, |label| names.key.labels.len() + 32 + label.len());
    let mut cmd = match waiter {
        Some(_) => evalsha(lua, 5 + labelled, 13 + 2 * labelled, bytes),
        None => evalsha(lua, 4 + labelled, 7 + 3 * labelled, bytes),
    };
    cmd.arg(&names.key.lock)
        .arg(&names.key.fence)
        .arg(&names.queue)
        .arg(&names.expiries);
    if let Some(waiter) = waiter {
        cmd.arg(names.request(waiter.id));
    }
    if label.is_some() {
        cmd.arg(names.key.label(owner));
    }
    cmd.arg(&owner_hex(owner)[..])
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention));
    match waiter {
        Some(waiter) => {
            cmd.arg(&owner_hex(waiter.id)[..])
                .arg(waiter.ticket)
                .arg(whole_millis(QUEUE_MARK))
                .arg(&owner_hex(waiter.next)[..])
                .arg(waiter.round);
        }
        // The labelled script finds the label last, after an empty waiter id.
        None if label.is_some() => {
            cmd.arg("");
        }
        None => {}
    }
    if let Some(label) = label {
        cmd.arg(label);
    }
    let reply: redis::Value = run_script(conn, lua, &cmd)
        .await
        .map_err(|e| script_error("acquire", source, e))?;
    match reply {
        redis::Value::Int(token) if token > 0 => Ok(NodeAttempt {
            attempt: Attempt::Granted {
                token: token as u64,
            },
            queued: false,
        }),
        redis::Value::Array(ref held) => match held.as_slice() {
            [redis::Value::Int(0), redis::Value::Int(pttl), redis::Value::Int(queued @ (0 | 1))] => {
                Ok(NodeAttempt {
                    attempt: Attempt::Held {
                        expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
                    },
                    queued: *queued == 1,
                })
            }
            _ => Err(unexpected("acquire", &reply)),
        },
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// What one node's raise found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raise {
    /// The fence was below the token and now holds it.
    Raised,
    /// The fence was already at this value, at or above the token.
    Ahead(u64),
    /// The node no longer holds this owner's lock: nothing was written.
    NotHeld,
}

/// Runs [`RAISE_LUA`] on one connection.
pub(crate) async fn raise_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    token: u64,
    retention: Duration,
) -> Result<Raise> {
    let mut cmd = evalsha(&RAISE, 2, 5, names.lock.len() + names.fence.len() + 64);
    cmd.arg(&names.lock)
        .arg(&names.fence)
        .arg(&owner_hex(owner)[..])
        .arg(token)
        .arg(whole_millis(retention));
    let found: i64 = run_script(conn, &RAISE, &cmd)
        .await
        .map_err(|e| script_error("raise", RAISE_LUA, e))?;
    match found {
        -1 => Ok(Raise::NotHeld),
        0 => Ok(Raise::Raised),
        fence if fence > 0 => Ok(Raise::Ahead(fence as u64)),
        other => Err(Error::Store {
            message: format!("raise: the script answered {other}, not a fence"),
            source: None,
        }),
    }
}

/// Runs [`WITHDRAW_LUA`] on one connection: `waiter` no longer waits, and a lock held by
/// one of the `stale` owners (at most two: server grants it will not collect) is deleted.
pub(crate) async fn withdraw_on<C: ConnectionLike>(
    conn: &mut C,
    names: &RedlockNames,
    waiter: OwnerId,
    stale: &[OwnerId],
    retention: Duration,
) -> Result<()> {
    debug_assert!(stale.len() <= 2);
    let mut cmd = evalsha(&WITHDRAW, 4, 10, 6 * names.queue.len() + 160);
    cmd.arg(&names.key.lock)
        .arg(&names.key.fence)
        .arg(&names.queue)
        .arg(&names.expiries)
        .arg(&owner_hex(waiter)[..])
        .arg(&names.key.channel)
        .arg(whole_millis(retention))
        .arg(names.request(waiter));
    for slot in 0..2 {
        match stale.get(slot) {
            Some(owner) => cmd.arg(&owner_hex(*owner)[..]),
            None => cmd.arg(""),
        };
    }
    let _: i64 = run_script(conn, &WITHDRAW, &cmd)
        .await
        .map_err(|e| script_error("withdraw", WITHDRAW_LUA, e))?;
    Ok(())
}

/// Runs [`RELEASE_LUA`] on one connection, or for a `labelled` lease
/// [`RELEASE_LABELLED_LUA`]; true if this owner's lock was deleted.
pub(crate) async fn release_on<C: ConnectionLike>(
    conn: &mut C,
    names: &RedlockNames,
    owner: OwnerId,
    retention: Duration,
    labelled: bool,
) -> Result<bool> {
    let (lua, source) = if labelled {
        (&*RELEASE_LABELLED, RELEASE_LABELLED_LUA)
    } else {
        (&*RELEASE, RELEASE_LUA)
    };
    let mut bytes = names.key.lock.len() + 3 * names.queue.len() + names.key.channel.len() + 60;
    bytes += usize::from(labelled) * (names.key.labels.len() + 32);
    let keys = 4 + usize::from(labelled);
    let mut cmd = evalsha(lua, keys, keys + 3, bytes);
    cmd.arg(&names.key.lock)
        .arg(&names.key.fence)
        .arg(&names.queue)
        .arg(&names.expiries);
    if labelled {
        cmd.arg(names.key.label(owner));
    }
    cmd.arg(&owner_hex(owner)[..])
        .arg(&names.key.channel)
        .arg(whole_millis(retention));
    let released: i64 = run_script(conn, lua, &cmd)
        .await
        .map_err(|e| script_error("release", source, e))?;
    Ok(released == 1)
}

/// The channel a waiter is woken on when it heads the key's queue.
pub(crate) fn waiter_channel(names: &RedlockNames, waiter: OwnerId) -> String {
    let hex = owner_hex(waiter);
    let mut channel = String::with_capacity(names.key.channel.len() + 1 + hex.len());
    channel.push_str(&names.key.channel);
    channel.push(':');
    channel.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    channel
}

fn unexpected(what: &str, reply: &redis::Value) -> Error {
    Error::Store {
        message: format!("{what}: unexpected reply from the script: {reply:?}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock granule of a Redlock mint, in µs: the config's, which bounds the window.
    const GRANULE_MICROS: u64 = crate::redlock::config::TOKEN_GRANULE.as_micros() as u64;

    /// `mint_lua!` on a real server, with the clock reading `t` given instead of read, and
    /// the fence it left with its remaining ms: what `floor_model::mint` is checked against.
    const MINT_AT_LUA: &str = concat!(
        r"
local t = {ARGV[1], ARGV[2]}
local token
",
        mint_lua!(),
        r"
return {token, tonumber(redis.call('GET', KEYS[2])), redis.call('PTTL', KEYS[2])}
"
    );

    /// The Lua mint is the model's: for fences missing, behind, within and ahead of the
    /// clock's granule, the script answers and writes `floor_model::mint`'s token, which
    /// expires one retention window later (the model's expiry).
    #[tokio::test]
    async fn the_lua_mint_is_the_models_mint() {
        use proptest::strategy::{Strategy, ValueTree};
        use proptest::test_runner::{Config, TestRunner};

        let mut conn = crate::script::tests::shared_connection().await;
        let script = redis::Script::new(MINT_AT_LUA);
        let fence_key = format!("mint-model:{}:fence", OwnerId::random());
        let retention_ms = 60_000u64;
        let g = GRANULE_MICROS;
        // A clock about 2024, and a fence some granules around it, or none.
        let cases = (
            1_700_000_000_000_000..1_800_000_000_000_000u64,
            proptest::option::of(-3 * g as i64..3 * g as i64),
        );
        let mut runner = TestRunner::new(Config::with_cases(64));
        for _ in 0..64 {
            let (now, fence_offset) = cases.new_tree(&mut runner).expect("a case").current();
            let fence = fence_offset.map(|offset| (now as i64 + offset) as u64);
            match fence {
                Some(fence) => {
                    let _: () = redis::cmd("SET")
                        .arg(&fence_key)
                        .arg(fence)
                        .query_async(&mut conn)
                        .await
                        .expect("SET fence");
                }
                None => {
                    let _: () = redis::cmd("DEL")
                        .arg(&fence_key)
                        .query_async(&mut conn)
                        .await
                        .expect("DEL fence");
                }
            }
            let (token, written, pttl): (u64, u64, i64) = script
                .key("mint-model:unused")
                .key(&fence_key)
                .arg(now / 1_000_000)
                .arg(now % 1_000_000)
                .arg(retention_ms)
                .invoke_async(&mut conn)
                .await
                .expect("mint script");
            let expected = crate::floor_model::mint(fence, now, g);
            assert_eq!(token, expected, "fence {fence:?} at {now} µs");
            assert_eq!(written, expected, "the fence holds the token");
            assert!(
                pttl > 0 && pttl as u64 <= retention_ms,
                "the fence expires within the window: {pttl} ms"
            );
        }
    }

    /// A node's acquire run twice with one owner id (a resend after an I/O error) finds the
    /// lock its first run set and takes it over, as a waiter's round takes over its own grants:
    /// granted with a fresh token, its expiry counted from the resend, even with another waiter
    /// at the head of the queue meanwhile. Answering "held" left a lock that counted against the
    /// quorum and stayed until its TTL.
    #[tokio::test]
    async fn a_resent_acquire_on_a_node_takes_its_own_lock_over() {
        let mut conn = crate::script::tests::shared_connection().await;
        let names = RedlockNames::new(KeyNames::new(
            &format!("redlock-script:{}:", OwnerId::random()),
            "resent",
        ));
        let (ttl, retention) = (Duration::from_secs(30), Duration::from_secs(600));
        let owner = OwnerId::random();
        let first = acquire_on(&mut conn, &names, owner, ttl, retention, None, None).await;
        let Ok(NodeAttempt {
            attempt: Attempt::Granted { token: first },
            ..
        }) = first
        else {
            panic!("a free key was refused: {first:?}");
        };
        // Another request waits, and heads the queue.
        let waiter = Waiter {
            id: OwnerId::random(),
            ticket: 1,
            next: OwnerId::random(),
            round: 1,
        };
        let queued = acquire_on(
            &mut conn,
            &names,
            OwnerId::random(),
            ttl,
            retention,
            Some(waiter),
            None,
        )
        .await;
        assert!(
            matches!(
                queued,
                Ok(NodeAttempt {
                    attempt: Attempt::Held { .. },
                    ..
                })
            ),
            "{queued:?}"
        );
        // As if the resend came 20 s later: the lock has 10 s left.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&names.key.lock)
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRE");
        let resent = acquire_on(&mut conn, &names, owner, ttl, retention, None, None).await;
        let Ok(NodeAttempt {
            attempt: Attempt::Granted { token },
            ..
        }) = resent
        else {
            panic!("the resend answered {resent:?}, not a grant");
        };
        assert!(token > first, "{token} after {first}");
        let (fence, left, queue): (u64, i64, u64) = redis::pipe()
            .cmd("GET")
            .arg(&names.key.fence)
            .cmd("PTTL")
            .arg(&names.key.lock)
            .cmd("ZCARD")
            .arg(&names.queue)
            .query_async(&mut conn)
            .await
            .expect("GET, PTTL, ZCARD");
        assert_eq!(fence, token, "the fence holds the token");
        assert!(left > 20_000, "the resend left {left} ms, not the TTL");
        assert_eq!(queue, 1, "the waiter is still queued");
    }

    #[test]
    fn the_scripts_constants_are_the_crates() {
        assert_eq!(stale_guard_ms!(), STALE_GUARD.as_millis().to_string());
        assert_eq!(
            fresh_lapse_ms!(),
            (QUEUE_MARK - GRANT_FRESH).as_millis().to_string()
        );
        // The scripts find a waiter's request next to the queue.
        let names = RedlockNames::new(KeyNames::new("p:", "k"));
        let stem = names.queue.strip_suffix("queue").expect("queue");
        assert_eq!(names.requests, format!("{stem}request:"));
    }

    #[test]
    fn the_script_rounds_the_clock_down_to_the_granule() {
        assert!(ACQUIRE_LUA.contains(&format!("now - now % {GRANULE_MICROS}")));
    }

    #[test]
    fn queue_names_share_the_hash_tag() {
        let names = RedlockNames::new(KeyNames::new("p:", "jobs/x"));
        assert_eq!(names.queue, "p:{jobs/x}:queue");
        assert_eq!(names.expiries, "p:{jobs/x}:queued");
        let waiter = OwnerId::parse(&format!("{:032x}", 7)).expect("hex");
        assert_eq!(
            names.request(waiter),
            format!("p:{{jobs/x}}:request:{waiter}")
        );
    }
}
