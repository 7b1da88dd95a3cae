//! The Lua scripts, one per atomic step, and the per-node steps that run them on one
//! connection (shared by [`RedisStore`](crate::RedisStore) and every Redlock node).

use std::sync::LazyLock;
use std::time::Duration;

use fencelock_core::raw::ttl::whole_millis;
use fencelock_core::{Error, HolderStatus, KeyStatus, Mode, OwnerId, Result};
use redis::aio::ConnectionLike;
use redis::{Script, ToRedisArgs};

use crate::error::script_error;
use crate::keys::{KeyNames, NameArg};

// ---- Lua ------------------------------------------------------------------------------------
// KEYS[1] is the lock key, KEYS[2] the fence key: both carry the same `{key}` hash tag, so they
// live in one Cluster slot. Keys, owners and channels are always KEYS/ARGV, never script text.

/// Lua minting a token from the fence (KEYS[2]) at the server clock, `t` (the reply of
/// `TIME`): the token is max(fence + 1, the clock in µs), written to the fence, which then
/// expires one retention window (ARGV[3] ms) later (the crate docs, `# Per-key state`, say why
/// a later token is still greater). Leaves it in `token`: the clock's digits as a string in
/// the usual case, a Lua number otherwise; either goes back to the client as the token.
///
/// One write in the usual case: `SET fence clock PX retention GET` writes the clock and
/// answers the fence it replaced, which is below the clock unless another grant fell within
/// the same µs (or the clock stepped back); then a second `SET` writes fence + 1. Redis before
/// 6.2 has no `SET … GET` and refuses it (a syntax error, under `pcall`, which answers a table
/// `{err = …}`): there the fence is read with `GET` first. The refusal is told by `old.err`, not
/// `type(old) == 'table'`: a string's `.err` is the string library's (none), `false` (no fence)
/// never gets indexed, and the lookup skips the call to the global `type` (about 500 of the
/// server's instructions per acquire, callgrind, as below).
///
/// The usual case converts no number: the clock is the digits `TIME` gave (seconds, then µs
/// padded to six by the `6 - #µs` zeros `string.sub('00000', #µs)` leaves, one concatenation
/// making one new string where padding all and cutting made three: about 500 instructions per
/// acquire), and the fence is compared with it as a string, by length, then by
/// character (both are digits only, which every locale's collation orders as numbers).
/// Converting (`tonumber`, or a Lua number passed to `redis.call`, which Redis formats with
/// `%.17g`) cost about 3k of the 65k instructions the server spent per acquire (callgrind).
/// The comparison is written out rather than as a `local function`: a closure is made at
/// every run of the script, and that cost 4.5k instructions per acquire, 5% of the server's
/// whole cycle (callgrind, `bench/benches/redis-cycle-cost.rs`). A number is still written in
/// full (Lua's own `tostring` would keep only 14 digits), and a µs clock stays below 2^53,
/// where a Lua number stops being exact, until 2255.
macro_rules! mint_lua {
    () => {
        r"
local clock = t[1] .. string.sub('00000', #t[2]) .. t[2]
local token = clock
local old = redis.pcall('SET', KEYS[2], clock, 'PX', ARGV[3], 'GET')
local refused = old and old.err
if refused then
  old = redis.call('GET', KEYS[2])
end
if old and (#old > #clock or (#old == #clock and old >= clock)) then
  token = tonumber(old) + 1
  redis.call('SET', KEYS[2], token, 'PX', ARGV[3])
elseif refused then
  redis.call('SET', KEYS[2], clock, 'PX', ARGV[3])
end
"
    };
}

// ---- the wait queue --------------------------------------------------------------------------
// A waiting request marks its place in the key's queue (KEYS `…:writers`, a sorted set, the
// name it had when only writers waited): member `arrival:mode:id`, the arrival the server's
// clock in µs at its first mark (16 digits, so members order as their arrivals), the mode `x`,
// `s` or `p`, the waiter's random id; scored by the mark's expiry in server µs, refreshed by
// every attempt of the waiter. A request is refused while a live mark ahead of it conflicts
// with it (every pair of modes but two readers), so no later request passes a waiter. A mark
// in the older form (a bare id: an earlier release's waiting writer) is a writer ahead of all.

/// Lua setting `ahead` (predeclared false, as `queued` is 0) if a live mark in the queue
/// (`$queue`) ahead of this request conflicts with it, and `queued` to the queue's size before
/// the purge. Expects `fmt`, `now`, `mode` (`x`, `s`, `p`), `id` (this waiter's id, or empty
/// for a single attempt) and `me` (this waiter's member, or the arrival `now` followed by `;`,
/// which sorts after every member of that µs). The reads run under `pcall`: a user without the
/// sorted-set rights (an exclusive-only user) sees no queue. Each waiter's own marks are
/// skipped, a mark left by an attempt whose answer was lost among them.
macro_rules! ahead_lua {
    ($queue:literal) => {
        concat!(
            r"
queued = redis.pcall('ZCARD', ",
            $queue,
            r")
if queued ~= 0 then
",
            scan_lua!($queue),
            r"
end
"
        )
    };
}

/// The body of [`ahead_lua!`], for a queue (`$queue`) that may have members (`queued ~= 0`).
macro_rules! scan_lua {
    ($queue:literal) => {
        concat!(
            r"
  redis.pcall('ZREMRANGEBYSCORE', ",
            $queue,
            r", '-inf', fmt('%d', now))
  local members = redis.pcall('ZRANGE', ",
            $queue,
            r", 0, -1)
  if not members.err then
    local own = ':' .. id
    for _, member in ipairs(members) do
      if id == '' or string.sub(member, -#own) ~= own then
        local m = string.match(member, '^%d+:([xsp]):')
        if not m or (member < me and not (m == 's' and mode == 's')) then
          ahead = true
          break
        end
      end
    end
  end
"
        )
    };
}

/// Lua that marks a refused waiter (`id` not empty) in the queue (`$queue`) as `me` for
/// `$mark` ms and lets the queue expire after its last mark, then returns `$reply`, in which
/// `marked` says whether the mark was written (under `pcall`, as [`ahead_lua!`] reads).
macro_rules! mark_lua {
    ($queue:literal, $mark:literal, $reply:literal) => {
        concat!(
            r"
local marked = false
if id ~= '' then
  local added = redis.pcall('ZADD', ",
            $queue,
            r", fmt('%d', now + tonumber(",
            $mark,
            r") * 1000), me)
  if type(added) ~= 'table' then
    marked = true
    local last = redis.call('ZRANGE', ",
            $queue,
            r", -1, -1, 'WITHSCORES')
    local px = math.ceil(tonumber(last[2]) / 1000) - math.floor(now / 1000) + 2
    redis.call('PEXPIRE', ",
            $queue,
            r", fmt('%d', px))
  end
end
return ",
            $reply,
            r"
"
        )
    };
}

/// Lua removing a granted waiter's marks (every member ending in its `id`) from the queue
/// (`$queue`), if the queue had any member (`queued`, from [`ahead_lua!`]).
macro_rules! unmark_lua {
    ($queue:literal) => {
        concat!(
            r"
if id ~= '' and queued ~= 0 then
  local members = redis.pcall('ZRANGE', ",
            $queue,
            r", 0, -1)
  if not members.err then
    local own = ':' .. id
    for _, member in ipairs(members) do
      if string.sub(member, -#own) == own then
        redis.pcall('ZREM', ",
            $queue,
            r", member)
      end
    end
  end
end
"
        )
    };
}

/// The exclusive acquire, with `$label` (Lua, or nothing) run on a grant before the mint.
macro_rules! acquire_lua {
    ($label:literal) => {
        concat!(
            r"
local queued = redis.pcall('ZCARD', KEYS[3])
if queued ~= 0 and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  local t = redis.call('TIME')
  local now = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.pcall('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local live = redis.pcall('ZCARD', KEYS[3])
  if type(live) == 'number' and live > 0 then
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
  or (redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])) then
",
            $label,
            r"  local t = redis.call('TIME')
",
            mint_lua!(),
            r"
  return token
end
return {0, redis.call('PTTL', KEYS[1])}
"
        )
    };
}

/// Acquire: refused while a live mark waits in the key's queue (every mark conflicts with an
/// exclusive request; one `ZCARD`, under `pcall`, when nobody waits), else `SET lock owner NX
/// PX ttl`; if it was set, mint the token from the fence at the server's `TIME` as `mint_lua!`
/// does. A lock that already holds this owner (a fresh id per
/// attempt) is this request sent again (the Cluster client resends after an I/O error), and its
/// first run's grant, which no one collected: it is set again for the TTL from now and minted
/// a fresh token, as a first grant is (the write also lets a following `WAIT` count it). Atomic:
/// a script runs alone on the server.
/// KEYS: lock, fence, queue. ARGV: owner, ttl ms, retention ms. Returns the token (a positive
/// integer) if granted, `{0, pttl}` if held or queued for (pttl -2 if free).
pub(crate) const ACQUIRE_LUA: &str = acquire_lua!("");

/// [`ACQUIRE_LUA`] for a labelled request: the grant also sets the holder's label key
/// (KEYS[4], named by the owner) to the label (ARGV[4]) for the same TTL, so the two expire
/// together. Atomic: the label is written by the script that grants. A separate script, so an
/// unlabelled acquire sends and runs exactly what it did before labels.
pub(crate) const ACQUIRE_LABELLED_LUA: &str =
    acquire_lua!("  redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[2])\n");

/// Release: delete the lock only if it still holds this owner, then wake waiters on the
/// key's channel. Atomic: compare, delete and publish in one script.
/// ARGV: owner, channel. Returns 1 if released, 0 if the lease was already gone.
pub(crate) const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
";

/// [`RELEASE_LUA`] for a labelled lease: the holder's label key (KEYS[2]) goes with the lock.
/// Atomic: compare, both deletes and publish in one script.
pub(crate) const RELEASE_LABELLED_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
";

/// Extend: reset the TTL only if the lock still holds this owner; PEXPIRE never creates a
/// missing key. Atomic: compare and expire in one script.
/// ARGV: owner, ttl ms. Returns 1 if extended, 0 if the lease is gone.
pub(crate) const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// [`EXTEND_LUA`] for a labelled lease: the holder's label key (KEYS[2]) gets the same TTL, so
/// it keeps expiring with the lock. Atomic: compare and both expires in one script.
pub(crate) const EXTEND_LABELLED_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Relabel: set the holder's label key to the new label only if the lock still holds this
/// owner, expiring when the lock does (its `PTTL`, read in the same script, so never before
/// it). Atomic: compare and set in one script.
/// KEYS: lock, label. ARGV: owner, label. Returns 1 if relabelled, 0 if the lease is gone.
pub(crate) const RELABEL_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', left)
    return 1
  end
end
return 0
";

/// Evict (the operator's "forget"): delete the lock whoever holds it, and the key's shared or
/// permit holders, with their labels, never the fence, and wake waiters. Atomic: delete and
/// publish in one script. The label keys are named inside the script, from their stem (ARGV[2],
/// under the key's hash tag, so in its slot), since only the script knows the holders.
/// KEYS: lock, holders. ARGV: channel, label stem. Returns 1 if a lock (or a mode's tag) was
/// deleted.
pub(crate) const EVICT_LUA: &str = r"
local owner = redis.call('GET', KEYS[1])
if owner and string.sub(owner, 1, 10) == 'fencelock:' then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    redis.call('DEL', ARGV[2] .. string.match(member, '^[^:]*'))
  end
elseif owner then
  redis.call('DEL', ARGV[2] .. owner)
end
local deleted = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
if deleted == 1 then
  redis.call('PUBLISH', ARGV[1], '')
  return 1
end
return 0
";

/// Status: the holder, its remaining TTL, its label and the fence, read together, and while
/// the key is held in shared or permit mode (the lock holds the mode's tag) its live holders
/// with the ms each has left by server TIME and each one's label. Atomic: one script, so the
/// values belong to one instant; a key held exclusively is read with `GET`/`PTTL` only, as
/// before. The label keys are named inside the script from their stem (ARGV[1], under the
/// key's hash tag, so in its slot) and each holder's owner, which only the script knows; a
/// holder without a label has no label key. KEYS: lock, fence, holders. ARGV: label stem.
/// Returns `{owner or tag or false, pttl, fence or false, {member, ms left, label or '', ...},
/// label or false}`.
pub(crate) const STATUS_LUA: &str = r"
local owner = redis.call('GET', KEYS[1])
local holders = {}
local label = false
if owner and string.sub(owner, 1, 10) == 'fencelock:' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local live = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%d', now), '+inf',
    'WITHSCORES')
  for i = 1, #live, 2 do
    holders[#holders + 1] = live[i]
    holders[#holders + 1] = string.format('%d', math.floor((tonumber(live[i + 1]) - now) / 1000))
    holders[#holders + 1] = redis.call('GET', ARGV[1] .. string.match(live[i], '^[^:]*')) or ''
  end
elseif owner then
  label = redis.call('GET', ARGV[1] .. owner)
end
return {owner, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), holders, label}
";

// ---- shared and permit modes ----------------------------------------------------------------
// While a key is held in shared or permit mode, its lock holds the mode's tag
// (`fencelock:shared`, `fencelock:permits:L`; never an owner id, so the exclusive scripts above
// see a held key and need no change) and expires with the last holder; the holders are a sorted
// set (member `owner:token:slot`, slot `-` when shared, scored by expiry in server µs) that
// expires with it. Every script purges expired holders by server TIME. The lock is the truth:
// holders left without their tag (evicted, expired) hold nothing.

/// Lua shared by the mode scripts: `fmt` is `string.format`, and `fmt('%d', n)` writes a
/// whole number in full (Lua's own conversion keeps 14 digits, too few for µs); `now` is the
/// server clock in µs. No `local function`: Lua makes a closure at every run of a script that
/// defines one (the two this prelude had cost the server 9k of the 231k instructions of a
/// shared acquire + release, callgrind, `bench/benches/redis-cycle-cost.rs`, `shared`).
macro_rules! prelude_lua {
    () => {
        r"
local fmt = string.format
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"
    };
}

/// Lua making the lock (set to the tag) and the holders set expire just after the last live
/// holder (ms rounded up, plus 2 ms: a script's writes count expiry from the clock it read when
/// it started), or deleting both when no holder is left; after `prelude_lua!`. Use it only
/// while the lock holds the tag or nothing. Arguments: the Lua expressions for the lock, the
/// tag and the holders.
macro_rules! hold_lua {
    ($lock:literal, $tag:literal, $holders:literal) => {
        concat!(
            "
local last = redis.call('ZRANGE', ",
            $holders,
            ", -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', ",
            $lock,
            ", ",
            $holders,
            ")
else
  local px = math.ceil(tonumber(last[2]) / 1000) - math.floor(now / 1000) + 2
  redis.call('SET', ",
            $lock,
            ", ",
            $tag,
            ", 'PX', fmt('%d', px))
  redis.call('PEXPIRE', ",
            $holders,
            ", fmt('%d', px))
end
"
        )
    };
}

/// Lua for a shared or permit request that is not a resend (`own` unset): refused with
/// `{3, 0, arrival}` while a conflicting mark waits ahead of it in the queue (KEYS[4]), which
/// then marks its own place (for ARGV[9] ms).
macro_rules! queued_ahead_lua {
    () => {
        concat!(
            r"
  if not own then
",
            ahead_lua!("KEYS[4]"),
            r"
    if ahead then
",
            mark_lua!("KEYS[4]", "ARGV[9]", "{3, 0, marked and arrival or 0}"),
            r"    end
  end
"
        )
    };
}

/// The shared or permit acquire, with `$label` (Lua, or nothing) run on a grant.
macro_rules! acquire_as_lua {
    ($label:literal) => {
        concat!(
    prelude_lua!(),
    r"
local id = ARGV[7]
local mode = ARGV[5] == '0' and 's' or 'p'
local arrival = tonumber(ARGV[8])
if arrival == 0 then
  arrival = now
end
local me = id == '' and fmt('%016d;', now) or (fmt('%016d', arrival) .. ':' .. mode .. ':' .. id)
local ahead, queued = false, 0
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 10) ~= 'fencelock:' then
",
    mark_lua!("KEYS[4]", "ARGV[9]", "{0, redis.call('PTTL', KEYS[1]), marked and arrival or 0}"),
    r"end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', fmt('%d', now))
local count = redis.call('ZCARD', KEYS[3])
if not held or count == 0 then
  if count > 0 then
    redis.call('DEL', KEYS[3])
    count = 0
  end
  held = false
end
local limit = tonumber(ARGV[5])
if held and held ~= ARGV[4] then
  if limit > 0 and string.sub(held, 1, 18) == 'fencelock:permits:' then
    return {2, tonumber(string.sub(held, 19)) or 0}
  end
",
    mark_lua!("KEYS[4]", "ARGV[9]", "{0, redis.call('PTTL', KEYS[1]), marked and arrival or 0}"),
    r"end
local slot = -1
local own, granted
if limit == 0 then
  if count > 0 then
    local mine = ARGV[1] .. ':'
    local since = fmt('%d', now + (tonumber(ARGV[2]) - tonumber(ARGV[6])) * 1000)
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], since, '+inf')) do
      if string.sub(member, 1, #mine) == mine then
        own = member
        granted = string.match(member, ':(%d+):%-$')
        break
      end
    end
  end
",
    queued_ahead_lua!(),
    r"
else
  local mine = ARGV[1] .. ':'
  local taken = {}
  for _, member in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if string.sub(member, 1, #mine) == mine then
      own = member
      local s
      granted, s = string.match(member, ':(%d+):(%d+)$')
      slot = tonumber(s)
      break
    end
    local s = string.match(member, ':(%d+)$')
    if s then
      taken[tonumber(s)] = true
    end
  end
",
    queued_ahead_lua!(),
    r"
  if not own and count >= limit then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
",
    mark_lua!(
        "KEYS[4]",
        "ARGV[9]",
        "{0, math.ceil((tonumber(first[2]) - now) / 1000), marked and arrival or 0}"
    ),
    r"  end
  if not own then
    slot = 0
    while taken[slot] do
      slot = slot + 1
    end
  end
end
if own then
  redis.call('ZADD', KEYS[3], fmt('%d', now + tonumber(ARGV[2]) * 1000), own)
",
    $label,
    hold_lua!("KEYS[1]", "ARGV[4]", "KEYS[3]"),
    r"
  return {1, granted, slot}
end
",
    mint_lua!(),
    r"
local member = ARGV[1] .. ':' .. fmt('%d', token) .. ':' .. (slot >= 0 and fmt('%d', slot) or '-')
redis.call('ZADD', KEYS[3], fmt('%d', now + tonumber(ARGV[2]) * 1000), member)
",
    $label,
    hold_lua!("KEYS[1]", "ARGV[4]", "KEYS[3]"),
    unmark_lua!("KEYS[4]"),
    r"
return {1, token, slot}
"
        )
    };
}

/// Acquire in shared or permit mode. Refused (`{0, pttl, arrival}`) while an exclusive holder
/// lives or the key is held in the other mode; while a conflicting mark waits ahead of it in
/// the key's queue (`{3, 0, arrival}`, see [`ahead_lua!`]); a permit while `limit` permits
/// live (`{0, ms until the first expires, arrival}`), or with `{2, limit held}` if they were
/// taken with another limit. A refused waiter (ARGV[7], its id, not empty) marks its place in
/// the queue (as of its `arrival`, ARGV[8], 0 at its first mark: now) for ARGV[9] ms; the
/// reply's `arrival` is the one marked (0: not marked), which its next attempt sends. A
/// granted waiter's marks go with the grant. Otherwise mints the token from the
/// same fence as the exclusive acquire, takes the lowest free slot (permits), adds the holder
/// and answers `{1, token, slot or -1}`.
///
/// A request whose owner (a fresh id per attempt) already holds a live member is the same
/// request sent again (the Cluster client resends a pipeline after an I/O error): it answers
/// that grant, its expiry counted from now (a write, which a following `WAIT` then counts),
/// and adds no second holder, so a resend never takes a second slot or leaves a reader nobody
/// holds. A permit finds its member in the slot scan; a shared request, on a key with live
/// holders, looks only at members scored from one resend window (ARGV[6] ms: the caller waits
/// no longer for an answer) before its own expiry on, which its first run's member is, unless
/// the server's clock jumped ahead by more than that between the runs. Atomic: one script.
/// KEYS: lock, fence, holders, queue. ARGV: owner, ttl ms, retention ms, tag, limit (0:
/// shared), resend window ms, waiter id (empty: a single attempt), arrival µs, mark ms.
pub(crate) const ACQUIRE_AS_LUA: &str = acquire_as_lua!("");

/// [`ACQUIRE_AS_LUA`] for a labelled request: a grant (a resend's too) also sets the holder's
/// label key (KEYS[5], named by the owner) to the label (ARGV[10]) for the holder's TTL.
/// Atomic: the label is written by the script that grants; a separate script, so an unlabelled
/// acquire runs exactly what it did before labels.
pub(crate) const ACQUIRE_AS_LABELLED_LUA: &str =
    acquire_as_lua!("redis.call('SET', KEYS[5], ARGV[10], 'PX', ARGV[2])\n");

/// The shared or permit release, with `$label` (Lua, or nothing) run as the holder goes.
macro_rules! release_as_lua {
    ($label:literal) => {
        concat!(
            prelude_lua!(),
            r"
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
",
            $label,
            r"redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt('%d', now))
",
            hold_lua!("KEYS[1]", "ARGV[2]", "KEYS[2]"),
            r"
redis.call('PUBLISH', ARGV[3], '')
return 1
"
        )
    };
}

/// Release in shared or permit mode: remove the holder only if the lock holds its mode's tag
/// and the holder (owner and token) is still live, re-time the lock and the holders to the
/// last one left (or delete both), and wake waiters on the key's channel, the one the
/// exclusive release publishes on. Atomic: one script.
/// KEYS: lock, holders. ARGV: member, tag, channel. Returns 1 if released, 0 if already gone.
pub(crate) const RELEASE_AS_LUA: &str = release_as_lua!("");

/// [`RELEASE_AS_LUA`] for a labelled lease: the holder's label key (KEYS[3]) goes with the
/// holder. Atomic: one script.
pub(crate) const RELEASE_AS_LABELLED_LUA: &str = release_as_lua!("redis.call('DEL', KEYS[3])\n");

/// The shared or permit extend, with `$label` (Lua, or nothing) run as the holder is renewed.
macro_rules! extend_as_lua {
    ($label:literal) => {
        concat!(
            prelude_lua!(),
            r"
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('ZADD', KEYS[2], fmt('%d', now + tonumber(ARGV[3]) * 1000), ARGV[1])
",
            $label,
            r"redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt('%d', now))
",
            hold_lua!("KEYS[1]", "ARGV[2]", "KEYS[2]"),
            r"
return 1
"
        )
    };
}

/// Extend in shared or permit mode: only a live holder (owner and token) under its mode's tag
/// gets `ttl` from now, and the lock and holders then expire with the last holder. Never
/// recreates a holder. Atomic: one script.
/// KEYS: lock, holders. ARGV: member, tag, ttl ms. Returns 1 if extended, 0 if gone.
pub(crate) const EXTEND_AS_LUA: &str = extend_as_lua!("");

/// [`EXTEND_AS_LUA`] for a labelled lease: the holder's label key (KEYS[3]) gets the same TTL,
/// so it keeps expiring with the holder. Atomic: one script.
pub(crate) const EXTEND_AS_LABELLED_LUA: &str =
    extend_as_lua!("redis.call('PEXPIRE', KEYS[3], ARGV[3])\n");

/// Relabel in shared or permit mode: only a live holder (owner and token) under its mode's tag
/// gets its label key set to the new label, expiring with the holder (its score, rounded up to
/// the ms). Atomic: compare and set in one script.
/// KEYS: lock, holders, label. ARGV: member, tag, label. Returns 1 if relabelled, 0 if gone.
pub(crate) const RELABEL_AS_LUA: &str = concat!(
    prelude_lua!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('SET', KEYS[3], ARGV[3], 'PX', fmt('%d', math.ceil((tonumber(score) - now) / 1000)))
return 1
"
);

/// The exclusive attempt of a waiting request, with `$label` (Lua, or nothing) run on a grant
/// before the mint.
macro_rules! acquire_waiting_lua {
    ($label:literal) => {
        concat!(
            r"
local fmt = string.format
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id, mode = ARGV[4], 'x'
local arrival = tonumber(ARGV[6])
if arrival == 0 then
  arrival = now
end
local me = fmt('%016d', arrival) .. ':x:' .. id
local ahead, queued = false, redis.pcall('ZCARD', KEYS[3])
local granted
if queued == 0 then
  granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
    or (redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]))
elseif redis.call('GET', KEYS[1]) == ARGV[1] then
  granted = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
",
            scan_lua!("KEYS[3]"),
            r"
  granted = not ahead and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
end
if granted then
",
            $label,
            mint_lua!(),
            unmark_lua!("KEYS[3]"),
            r"
  return {1, token}
end
",
            mark_lua!(
                "KEYS[3]",
                "ARGV[5]",
                "{0, redis.call('PTTL', KEYS[1]), marked and 1 or 0, marked and arrival or 0}"
            ),
        )
    };
}

/// An exclusive attempt of a request that waits: [`ACQUIRE_LUA`] (a resend taking its own lock
/// over as there, whatever waits), refused while a live mark waits ahead of it in the key's
/// queue, and if refused, the waiter's mark in the queue (see [`ahead_lua!`]), as of its
/// `arrival` (ARGV[6], 0 at its first mark: now), for ARGV[5] ms; a grant removes its marks.
/// The queue's reads and writes run under `pcall`: a user without the sorted-set rights
/// (exclusive locks needed none before) still waits, unmarked, and the third field says so.
/// Atomic: one script. KEYS: lock, fence, queue. ARGV: owner, ttl ms, retention ms, waiter id,
/// mark ms, arrival µs. Returns `{1, token}` if granted, `{0, pttl, 1 if marked else 0,
/// arrival marked or 0}` if refused.
pub(crate) const ACQUIRE_WAITING_LUA: &str = acquire_waiting_lua!("");

/// [`ACQUIRE_WAITING_LUA`] for a labelled request: a grant also sets the holder's label key
/// (KEYS[4], named by the owner) to the label (ARGV[7]) for the same TTL. Atomic: the label is
/// written by the script that grants.
pub(crate) const ACQUIRE_WAITING_LABELLED_LUA: &str =
    acquire_waiting_lua!("  redis.call('SET', KEYS[4], ARGV[7], 'PX', ARGV[2])\n");

/// A waiter stops waiting: remove its marks (every member ending in its id) from the key's
/// queue and, if one was there, wake the key's waiters (those it kept out). Atomic: one script.
/// KEYS: queue. ARGV: waiter id, channel.
pub(crate) const WITHDRAW_LUA: &str = r"
local own = ':' .. ARGV[1]
local removed = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, -#own) == own then
    removed = removed + redis.call('ZREM', KEYS[1], member)
  end
end
if removed > 0 then
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
";

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LUA));
static EXTEND: LazyLock<Lua> = LazyLock::new(|| Lua::new(EXTEND_LUA));
static EVICT: LazyLock<Lua> = LazyLock::new(|| Lua::new(EVICT_LUA));
static STATUS: LazyLock<Lua> = LazyLock::new(|| Lua::new(STATUS_LUA));
static ACQUIRE_AS: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_AS_LUA));
static RELEASE_AS: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_AS_LUA));
static EXTEND_AS: LazyLock<Lua> = LazyLock::new(|| Lua::new(EXTEND_AS_LUA));
static ACQUIRE_WAITING: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_WAITING_LUA));
static WITHDRAW: LazyLock<Lua> = LazyLock::new(|| Lua::new(WITHDRAW_LUA));
static ACQUIRE_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_LABELLED_LUA));
static RELEASE_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_LABELLED_LUA));
static EXTEND_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(EXTEND_LABELLED_LUA));
static RELABEL: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELABEL_LUA));
static ACQUIRE_AS_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(ACQUIRE_AS_LABELLED_LUA));
static RELEASE_AS_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELEASE_AS_LABELLED_LUA));
static EXTEND_AS_LABELLED: LazyLock<Lua> = LazyLock::new(|| Lua::new(EXTEND_AS_LABELLED_LUA));
static RELABEL_AS: LazyLock<Lua> = LazyLock::new(|| Lua::new(RELABEL_AS_LUA));
static ACQUIRE_WAITING_LABELLED: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(ACQUIRE_WAITING_LABELLED_LUA));

// ---- the steps ------------------------------------------------------------------------------

/// What one acquire script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The lock was free, or held by this very request's earlier run (a resend), and is now
    /// ours with this token.
    Granted { token: u64 },
    /// Another owner holds it; it expires in this long if the server knows (`None` for a key
    /// without expiry, which this store never writes).
    Held { expires_in: Option<Duration> },
}

/// Runs the acquire script on one connection (EVALSHA, loading the script on NOSCRIPT); a
/// granted acquire leaves the fence to expire `retention` later, and with a `label` keeps it
/// beside the holder.
pub(crate) async fn acquire_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
    label: Option<&str>,
) -> Result<Attempt> {
    let Some(label) = label else {
        let (lock, fence, queue) = (
            NameArg::Whole(names.lock.as_str().into()),
            NameArg::Whole(names.fence.as_str().into()),
            NameArg::Whole(names.writers.as_str().into()),
        );
        return acquire_keys_on(conn, &lock, &fence, &queue, owner, ttl, retention).await;
    };
    let reply: redis::Value = ACQUIRE_LABELLED
        .key(&names.lock)
        .key(&names.fence)
        .key(&names.writers)
        .key(names.label(owner))
        .arg(&owner_hex(owner)[..])
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention))
        .arg(label)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("acquire", ACQUIRE_LABELLED_LUA, e))?;
    attempt_of(reply)
}

/// [`acquire_on`] given only the three names the script uses.
pub(crate) async fn acquire_keys_on<C: ConnectionLike>(
    conn: &mut C,
    lock: &NameArg<'_>,
    fence: &NameArg<'_>,
    queue: &NameArg<'_>,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
) -> Result<Attempt> {
    let mut cmd = evalsha(&ACQUIRE, 3, 6, lock.len() + fence.len() + queue.len() + 64);
    cmd.arg(lock)
        .arg(fence)
        .arg(queue)
        .arg(&owner_hex(owner)[..])
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention));
    let reply: redis::Value = run_script(conn, &ACQUIRE, &cmd)
        .await
        .map_err(|e| script_error("acquire", ACQUIRE_LUA, e))?;
    attempt_of(reply)
}

/// A Lua script with its source: run by its hash (`EVALSHA`); on a node that answers
/// `NOSCRIPT`, loaded (`SCRIPT LOAD`) and run by its hash again; and where that meets
/// `NOSCRIPT` once more, run by its source (`EVAL`, which caches it there too).
///
/// On a Cluster, `SCRIPT LOAD` goes to the masters of the client's slot map, and right after
/// a failover the promoted master may not be among them yet, so the second `EVALSHA`, routed
/// by its keys, meets `NOSCRIPT` again (seen once in eight parallel test runs, on an acquire
/// just after a failover). `EVAL` goes where the keys go, with the script. It comes last
/// because a least-privilege user needs only `EVALSHA` and `SCRIPT LOAD` (the crate docs'
/// list of rights); such a user, right after a Cluster failover, gets the `NOSCRIPT` error.
pub(crate) struct Lua {
    script: Script,
    source: &'static str,
}

impl Lua {
    pub(crate) fn new(source: &'static str) -> Self {
        Lua {
            script: Script::new(source),
            source,
        }
    }

    /// An invocation with this first key.
    pub(crate) fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
        .key(key)
    }
}

/// A call of a [`Lua`] script being built, as the redis crate's `ScriptInvocation`.
pub(crate) struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub(crate) fn key<T: ToRedisArgs>(mut self, key: T) -> Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(crate) fn arg<T: ToRedisArgs>(mut self, arg: T) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Runs the script (see [`Lua`] for `NOSCRIPT`).
    pub(crate) async fn invoke_async<C: ConnectionLike, T: redis::FromRedisValue>(
        &self,
        conn: &mut C,
    ) -> redis::RedisResult<T> {
        let bytes = self.keys.iter().chain(&self.args).map(Vec::len).sum();
        let mut cmd = evalsha(
            self.lua,
            self.keys.len(),
            self.keys.len() + self.args.len(),
            bytes,
        );
        for part in self.keys.iter().chain(&self.args) {
            cmd.arg(&part[..]);
        }
        run_script(conn, self.lua, &cmd).await
    }
}

/// `EVALSHA sha numkeys` with room for `args` more arguments (keys and values, `bytes` of
/// them), for [`run_script`]: one command built in place, where an [`Invocation`] copies each
/// key and argument into a vector of its own first (the hot paths, acquire and release, use
/// this).
pub(crate) fn evalsha(lua: &Lua, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3 + args, 16 + 40 + bytes);
    cmd.arg("EVALSHA").arg(lua.script.get_hash()).arg(keys);
    cmd
}

/// Sends an [`evalsha`] command, and on `NOSCRIPT` takes the way [`Lua`] describes.
pub(crate) async fn run_script<C: ConnectionLike, T: redis::FromRedisValue>(
    conn: &mut C,
    lua: &Lua,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        // Boxed, as the rare path: inline, its future would be copied with every call's.
        Err(e) if is_noscript(&e) => Box::pin(load_and_run(conn, lua, cmd)).await,
        other => other,
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// [`run_script`]'s way after a `NOSCRIPT`: load the script and send `cmd` again; on a second
/// `NOSCRIPT`, send it as `EVAL` (see [`Lua`]).
async fn load_and_run<C: ConnectionLike, T: redis::FromRedisValue>(
    conn: &mut C,
    lua: &Lua,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    lua.script.prepare_invoke().load_async(conn).await?;
    match cmd.query_async(conn).await {
        Err(e) if is_noscript(&e) => eval_of(lua, cmd).query_async(conn).await,
        other => other,
    }
}

/// `cmd` (`EVALSHA sha numkeys keys… args…`) as `EVAL source numkeys keys… args…`.
fn eval_of(lua: &Lua, cmd: &redis::Cmd) -> redis::Cmd {
    let mut eval = redis::Cmd::with_capacity(cmd.args_iter().count(), lua.source.len() + 64);
    eval.arg("EVAL").arg(lua.source);
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// What the acquire script's reply says: a positive integer (or its digits, as `mint_lua!`
/// leaves the token) is the token, `{0, pttl}` a held key.
fn attempt_of(reply: redis::Value) -> Result<Attempt> {
    match reply {
        redis::Value::Int(token) if token > 0 => Ok(Attempt::Granted {
            token: token as u64,
        }),
        redis::Value::BulkString(ref digits) => match std::str::from_utf8(digits)
            .ok()
            .and_then(|digits| digits.parse::<u64>().ok())
        {
            Some(token) if token > 0 => Ok(Attempt::Granted { token }),
            _ => Err(unexpected_value("acquire", &reply)),
        },
        redis::Value::Array(ref held) => match held.as_slice() {
            [redis::Value::Int(0), redis::Value::Int(pttl)] => Ok(Attempt::Held {
                expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            _ => Err(unexpected_value("acquire", &reply)),
        },
        _ => Err(unexpected_value("acquire", &reply)),
    }
}

/// Runs the release script on one connection, given the two names it uses; true if this
/// owner's lock was deleted.
pub(crate) async fn release_keys_on<C: ConnectionLike>(
    conn: &mut C,
    lock: &NameArg<'_>,
    channel: &NameArg<'_>,
    owner: OwnerId,
) -> Result<bool> {
    let mut cmd = evalsha(&RELEASE, 1, 3, lock.len() + channel.len() + 40);
    cmd.arg(lock).arg(&owner_hex(owner)[..]).arg(channel);
    let released: i64 = run_script(conn, &RELEASE, &cmd)
        .await
        .map_err(|e| script_error("release", RELEASE_LUA, e))?;
    Ok(released == 1)
}

/// Runs the labelled release script on one connection: [`release_keys_on`] for a lease whose
/// holder has a label, which goes with the lock.
pub(crate) async fn release_labelled_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
) -> Result<bool> {
    let released: i64 = RELEASE_LABELLED
        .key(&names.lock)
        .key(names.label(owner))
        .arg(&owner_hex(owner)[..])
        .arg(&names.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("release", RELEASE_LABELLED_LUA, e))?;
    Ok(released == 1)
}

/// Runs the extend script on one connection; true if this owner's lock got a fresh TTL. A
/// `labelled` lease's label key gets it too.
pub(crate) async fn extend_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    labelled: bool,
) -> Result<bool> {
    let (lua, source) = if labelled {
        (&*EXTEND_LABELLED, EXTEND_LABELLED_LUA)
    } else {
        (&*EXTEND, EXTEND_LUA)
    };
    let mut invocation = lua.key(&names.lock);
    if labelled {
        invocation = invocation.key(names.label(owner));
    }
    let extended: i64 = invocation
        .arg(owner.to_string())
        .arg(whole_millis(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("extend", source, e))?;
    Ok(extended == 1)
}

/// Runs the relabel script on one connection; true if this owner still held the lock and its
/// label is now `label`.
pub(crate) async fn relabel_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    label: &str,
) -> Result<bool> {
    let relabelled: i64 = RELABEL
        .key(&names.lock)
        .key(names.label(owner))
        .arg(owner.to_string())
        .arg(label)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("relabel", RELABEL_LUA, e))?;
    Ok(relabelled == 1)
}

/// Runs the evict script on one connection; true if a lock was deleted.
pub(crate) async fn evict_on<C: ConnectionLike>(conn: &mut C, names: &KeyNames) -> Result<bool> {
    let evicted: i64 = EVICT
        .key(&names.lock)
        .key(&names.holders)
        .arg(&names.channel)
        .arg(&names.labels)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("evict", EVICT_LUA, e))?;
    Ok(evicted == 1)
}

/// Runs the status script on one connection.
pub(crate) async fn status_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
) -> Result<KeyStatus> {
    type Reply = (
        Option<String>,
        i64,
        Option<String>,
        Vec<String>,
        Option<String>,
    );
    let (owner, pttl, fence, holders, label): Reply = STATUS
        .key(&names.lock)
        .key(&names.fence)
        .key(&names.holders)
        .arg(&names.labels)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("status", STATUS_LUA, e))?;
    let Some(owner) = owner else {
        return Ok(KeyStatus::Free);
    };
    let Some(mode) = mode_of_tag(&owner) else {
        return Ok(KeyStatus::Held {
            owner: OwnerId::parse(&owner),
            token: fence.and_then(|f| f.parse().ok()),
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            label,
        });
    };
    let holders: Vec<HolderStatus> = holders
        .chunks_exact(3)
        .map(|holder| {
            let (owner, token, slot) = parse_member(&holder[0]);
            let remaining = holder[1].parse().ok().map(Duration::from_millis);
            // A label is at least one byte: the script's empty string is "none".
            let label = Some(holder[2].clone()).filter(|label| !label.is_empty());
            HolderStatus::new(owner, token, slot, remaining).with_label(label)
        })
        .collect();
    Ok(if holders.is_empty() {
        // The tag outlives its last holder by at most a few ms: nothing is held.
        KeyStatus::Free
    } else {
        KeyStatus::Shared {
            mode,
            count: u32::try_from(holders.len()).unwrap_or(u32::MAX),
            holders,
        }
    })
}

// ---- shared and permit modes ----------------------------------------------------------------

/// The tag the lock holds while the key is held in `mode`: `fencelock:shared` or
/// `fencelock:permits:L`; `None` for an exclusive lease (and any mode this crate does not keep).
pub(crate) fn tag_of(mode: Mode) -> Option<String> {
    match mode {
        Mode::Shared => Some("fencelock:shared".to_owned()),
        Mode::Permit { limit } => Some(format!("fencelock:permits:{limit}")),
        _ => None,
    }
}

/// The mode a lock's value is the tag of, if it is one.
pub(crate) fn mode_of_tag(value: &str) -> Option<Mode> {
    match value.strip_prefix("fencelock:")? {
        "shared" => Some(Mode::Shared),
        other => other
            .strip_prefix("permits:")?
            .parse()
            .ok()
            .map(Mode::permits),
    }
}

/// A holder's member of the holders set: `owner:token:slot`, slot `-` for a shared lease.
pub(crate) fn member(owner: OwnerId, token: u64, slot: Option<u32>) -> String {
    match slot {
        Some(slot) => format!("{owner}:{token}:{slot}"),
        None => format!("{owner}:{token}:-"),
    }
}

/// The owner, token and slot of a member, each `None` if it does not parse.
fn parse_member(member: &str) -> (Option<OwnerId>, Option<u64>, Option<u32>) {
    let mut parts = member.splitn(3, ':');
    let owner = parts.next().and_then(OwnerId::parse);
    let token = parts.next().and_then(|t| t.parse().ok());
    let slot = parts.next().and_then(|s| s.parse().ok());
    (owner, token, slot)
}

/// What one shared or permit acquire script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModeAttempt {
    /// Granted with this token, and for a permit this slot.
    Granted { token: u64, slot: Option<u32> },
    /// Held in a way that excludes the request (an exclusive holder, the other mode, all
    /// permits taken, a waiting writer); the earliest change by expiry, if one is known.
    Held { expires_in: Option<Duration> },
    /// The key's permits are held with this other limit.
    LimitMismatch { held: u32 },
}

/// Runs the shared or permit acquire script on one connection, as a single attempt (it marks
/// no place in the queue); `mode` is not exclusive. `resend_window` is the longest a resend of
/// this request can follow its first run and still be answered to the caller (the command
/// timeout).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_as_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
    mode: Mode,
    resend_window: Duration,
    label: Option<&str>,
) -> Result<ModeAttempt> {
    let (attempt, _) = acquire_as_waiting_on(
        conn,
        names,
        owner,
        ttl,
        retention,
        mode,
        resend_window,
        label,
        None,
    )
    .await?;
    Ok(attempt)
}

/// A waiter's place in a key's queue: its id, the arrival of its first mark (0 before it has
/// one), and how long a mark lives unrefreshed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) waiter: &'a str,
    pub(crate) arrival: u64,
    pub(crate) mark: Duration,
}

/// Runs the shared or permit acquire script on one connection; `mode` is not exclusive, and
/// `resend_window` is the longest a resend can follow its first run and still be answered (the
/// command timeout). An attempt of a waiter at `place` marks its place when refused (`None`: a
/// single attempt, which marks nothing); the second field is the arrival marked (0: none).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn acquire_as_waiting_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
    mode: Mode,
    resend_window: Duration,
    label: Option<&str>,
    place: Option<Place<'_>>,
) -> Result<(ModeAttempt, u64)> {
    let (Some(tag), limit) = (tag_of(mode), limit_of(mode)) else {
        return Err(Error::Unsupported {
            operation: "this lock mode",
        });
    };
    let (lua, source) = match label {
        None => (&*ACQUIRE_AS, ACQUIRE_AS_LUA),
        Some(_) => (&*ACQUIRE_AS_LABELLED, ACQUIRE_AS_LABELLED_LUA),
    };
    let mut invocation = lua
        .key(&names.lock)
        .key(&names.fence)
        .key(&names.holders)
        .key(&names.writers);
    if label.is_some() {
        invocation = invocation.key(names.label(owner));
    }
    invocation = invocation
        .arg(owner.to_string())
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention))
        .arg(tag)
        .arg(limit)
        .arg(whole_millis(resend_window))
        .arg(place.map_or("", |p| p.waiter))
        .arg(place.map_or(0, |p| p.arrival))
        .arg(place.map_or(0, |p| whole_millis(p.mark)));
    if let Some(label) = label {
        invocation = invocation.arg(label);
    }
    let reply: Vec<i64> = invocation
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("acquire", source, e))?;
    let marked = |arrival: &i64| u64::try_from(*arrival).unwrap_or(0);
    match reply.as_slice() {
        [1, token, slot] if *token > 0 => Ok((
            ModeAttempt::Granted {
                token: *token as u64,
                slot: match (mode, u32::try_from(*slot)) {
                    (Mode::Permit { limit }, Ok(slot)) if slot < limit => Some(slot),
                    (Mode::Shared, Err(_)) => None,
                    _ => return Err(unexpected("acquire", &reply)),
                },
            },
            0,
        )),
        [0, pttl, arrival] => Ok((
            ModeAttempt::Held {
                expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
            },
            marked(arrival),
        )),
        [2, held] => match u32::try_from(*held) {
            Ok(held) if held > 0 => Ok((ModeAttempt::LimitMismatch { held }, 0)),
            _ => Err(unexpected("acquire", &reply)),
        },
        [3, _, arrival] => Ok((ModeAttempt::Held { expires_in: None }, marked(arrival))),
        other => Err(unexpected("acquire", other)),
    }
}

/// The limit sent with a request in `mode`: the permits' limit, 0 for shared.
fn limit_of(mode: Mode) -> u32 {
    match mode {
        Mode::Permit { limit } => limit,
        _ => 0,
    }
}

/// Runs the shared or permit release script on one connection; true if this holder (owner and
/// token) was removed. `tag` is [`tag_of`] the lease's mode; `label` the holder's label key,
/// for a holder that has one.
pub(crate) async fn release_as_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    member: &str,
    tag: &str,
    label: Option<&str>,
) -> Result<bool> {
    let (lua, source) = match label {
        None => (&*RELEASE_AS, RELEASE_AS_LUA),
        Some(_) => (&*RELEASE_AS_LABELLED, RELEASE_AS_LABELLED_LUA),
    };
    let released: i64 = lua
        .key(&names.lock)
        .key(&names.holders)
        .key(label)
        .arg(member)
        .arg(tag)
        .arg(&names.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("release", source, e))?;
    Ok(released == 1)
}

/// Runs the shared or permit extend script on one connection; true if this holder got a fresh
/// TTL. `label` is the holder's label key, for a holder that has one.
pub(crate) async fn extend_as_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    member: &str,
    tag: &str,
    ttl: Duration,
    label: Option<&str>,
) -> Result<bool> {
    let (lua, source) = match label {
        None => (&*EXTEND_AS, EXTEND_AS_LUA),
        Some(_) => (&*EXTEND_AS_LABELLED, EXTEND_AS_LABELLED_LUA),
    };
    let extended: i64 = lua
        .key(&names.lock)
        .key(&names.holders)
        .key(label)
        .arg(member)
        .arg(tag)
        .arg(whole_millis(ttl))
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("extend", source, e))?;
    Ok(extended == 1)
}

/// Runs the shared or permit relabel script on one connection; true if this holder (owner and
/// token) was live and its label key (`label_key`) now holds `label`.
pub(crate) async fn relabel_as_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    member: &str,
    tag: &str,
    label_key: &str,
    label: &str,
) -> Result<bool> {
    let relabelled: i64 = RELABEL_AS
        .key(&names.lock)
        .key(&names.holders)
        .key(label_key)
        .arg(member)
        .arg(tag)
        .arg(label)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("relabel", RELABEL_AS_LUA, e))?;
    Ok(relabelled == 1)
}

/// Runs the exclusive attempt of a waiting request on one connection: refused, the waiter
/// marks its `place` in the key's queue. The second field is the arrival marked (`None`: the
/// user may not write the queue).
pub(crate) async fn acquire_waiting_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    owner: OwnerId,
    ttl: Duration,
    retention: Duration,
    place: Place<'_>,
    label: Option<&str>,
) -> Result<(Attempt, Option<u64>)> {
    let (lua, source) = match label {
        None => (&*ACQUIRE_WAITING, ACQUIRE_WAITING_LUA),
        Some(_) => (&*ACQUIRE_WAITING_LABELLED, ACQUIRE_WAITING_LABELLED_LUA),
    };
    let mut invocation = lua.key(&names.lock).key(&names.fence).key(&names.writers);
    if label.is_some() {
        invocation = invocation.key(names.label(owner));
    }
    let reply: Vec<i64> = invocation
        .arg(owner.to_string())
        .arg(whole_millis(ttl))
        .arg(whole_millis(retention))
        .arg(place.waiter)
        .arg(whole_millis(place.mark))
        .arg(place.arrival)
        .arg(label)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("acquire", source, e))?;
    match reply.as_slice() {
        [1, token] if *token > 0 => Ok((
            Attempt::Granted {
                token: *token as u64,
            },
            Some(place.arrival),
        )),
        [0, pttl, marked @ (0 | 1), arrival] => Ok((
            Attempt::Held {
                expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
            },
            (*marked == 1).then(|| u64::try_from(*arrival).unwrap_or(0)),
        )),
        other => Err(unexpected("acquire", other)),
    }
}

/// Runs the withdraw script on one connection: `waiter` no longer waits.
pub(crate) async fn withdraw_on<C: ConnectionLike>(
    conn: &mut C,
    names: &KeyNames,
    waiter: &str,
) -> Result<()> {
    let _: i64 = WITHDRAW
        .key(&names.writers)
        .arg(waiter)
        .arg(&names.channel)
        .invoke_async(conn)
        .await
        .map_err(|e| script_error("withdraw", WITHDRAW_LUA, e))?;
    Ok(())
}

/// The owner id as its 32 lowercase hex digits, the form `OwnerId`'s `Display` writes, without
/// the formatting machinery (it ran twice per lock cycle).
pub(crate) fn owner_hex(owner: OwnerId) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let id = owner.as_u128();
    let mut hex = [0u8; 32];
    for (i, digit) in hex.iter_mut().enumerate() {
        *digit = DIGITS[((id >> (124 - 4 * i)) & 0xf) as usize];
    }
    hex
}

/// A reply the script never gives, described by its shape only (a string in it could hold
/// anything the server had).
fn unexpected_value(what: &str, reply: &redis::Value) -> Error {
    let shape = match reply {
        redis::Value::Int(n) => n.to_string(),
        redis::Value::Array(items) => format!("an array of {}", items.len()),
        _ => "a reply that is neither a token nor an array".to_owned(),
    };
    Error::Store {
        message: format!("{what}: the script answered {shape}, which it never returns"),
        source: None,
    }
}

fn unexpected(what: &str, reply: &[i64]) -> Error {
    Error::Store {
        message: format!("{what}: the script answered {reply:?}, which it never returns"),
        source: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const RETENTION_MS: u64 = 600_000;
    /// The resend window of the shared and permit acquire: the default command timeout.
    const WINDOW: Duration = crate::DEFAULT_COMMAND_TIMEOUT;

    /// The acquire script as it runs, and as Redis before 6.2 runs it: there `SET … GET` is a
    /// syntax error, which a flag no Redis knows gives here too, so the fence is read by `GET`
    /// first.
    fn variants() -> [(&'static str, String); 2] {
        let old_server = ACQUIRE_LUA.replace("ARGV[3], 'GET')", "ARGV[3], 'NO-SUCH-FLAG')");
        assert_ne!(
            old_server, ACQUIRE_LUA,
            "the pcall'd SET … GET is where it was"
        );
        [
            ("SET … GET", ACQUIRE_LUA.to_owned()),
            ("GET, then SET", old_server),
        ]
    }

    /// A connection to the shared test server, for the script tests here and in Redlock's.
    pub(crate) async fn shared_connection() -> redis::aio::MultiplexedConnection {
        redis::Client::open(test_servers::shared::redis().url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    }

    /// A connection whose `SCRIPT LOAD`s reach no node, as a Cluster client's do right after a
    /// failover for the promoted master it does not know yet: it answers them with the hash
    /// and sends nothing.
    struct LoadsGoElsewhere(redis::aio::MultiplexedConnection);

    impl ConnectionLike for LoadsGoElsewhere {
        fn req_packed_command<'a>(
            &'a mut self,
            cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, redis::Value> {
            let mut args = cmd.args_iter();
            let load = matches!(
                (args.next(), args.next()),
                (Some(redis::Arg::Simple(a)), Some(redis::Arg::Simple(b)))
                    if a.eq_ignore_ascii_case(b"SCRIPT") && b.eq_ignore_ascii_case(b"LOAD")
            );
            if load {
                let hash = Script::new(&String::from_utf8_lossy(match args.next() {
                    Some(redis::Arg::Simple(source)) => source,
                    _ => b"",
                }))
                .get_hash()
                .to_owned();
                return Box::pin(async move { Ok(redis::Value::BulkString(hash.into_bytes())) });
            }
            self.0.req_packed_command(cmd)
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a redis::Pipeline,
            offset: usize,
            count: usize,
        ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
            self.0.req_packed_commands(pipeline, offset, count)
        }

        fn get_db(&self) -> i64 {
            self.0.get_db()
        }
    }

    /// A node that does not have the script and is not reached by `SCRIPT LOAD` still runs it:
    /// the acquire and a script run through an [`Invocation`] both fall back to `EVAL` after the
    /// load and retry. (With the redis crate's load-and-retry alone, both answered `NOSCRIPT`.)
    #[tokio::test]
    async fn a_node_that_lacks_the_script_and_misses_the_load_still_runs_it() {
        // A server of its own: SCRIPT FLUSH on the shared one would fail the other tests'
        // load-and-retry in between.
        let server = test_servers::RedisServer::start().expect("a redis server");
        let client = redis::Client::open(server.url()).expect("url");
        let mut conn = LoadsGoElsewhere(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect"),
        );
        let key = format!("noscript:{}", OwnerId::random());
        let names = KeyNames::new("", &key);
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn.0)
            .await
            .expect("SCRIPT FLUSH");
        let attempt = acquire_on(
            &mut conn,
            &names,
            OwnerId::random(),
            Duration::from_secs(30),
            Duration::from_millis(RETENTION_MS),
            None,
        )
        .await
        .expect("the acquire runs by EVAL");
        assert!(matches!(attempt, Attempt::Granted { .. }), "{attempt:?}");
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn.0)
            .await
            .expect("SCRIPT FLUSH");
        let status = status_on(&mut conn, &names)
            .await
            .expect("the status script runs by EVAL");
        assert!(matches!(status, KeyStatus::Held { .. }), "{status:?}");
    }

    async fn server_micros(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
        s * 1_000_000 + us
    }

    async fn acquire(
        conn: &mut redis::aio::MultiplexedConnection,
        script: &Script,
        key: &str,
    ) -> Attempt {
        let reply: redis::Value = script
            .key(format!("{key}:lock"))
            .key(format!("{key}:fence"))
            .arg(&owner_hex(OwnerId::random())[..])
            .arg(30_000)
            .arg(RETENTION_MS)
            .invoke_async(conn)
            .await
            .expect("acquire script");
        attempt_of(reply).expect("an acquire reply")
    }

    /// Both ways of minting give max(fence + 1, server µs), write it to the fence and let the
    /// fence expire one retention window later: with no fence, a fence behind the clock and
    /// one ahead of it; and a held key answers its TTL.
    #[tokio::test]
    async fn the_token_is_the_fence_plus_one_or_the_clock_and_the_fence_expires_after_retention() {
        let mut conn = shared_connection().await;
        let run = OwnerId::random();
        for (way, text) in variants() {
            let script = Script::new(&text);
            for (case, fence) in [
                ("no fence", None),
                ("a fence behind the clock", Some(5u64)),
                // As many digits as the clock: compared digit by digit, not by length.
                (
                    "a fence of as many digits behind the clock",
                    Some(1_000_000_000_000_000),
                ),
                ("a fence ahead of the clock", Some(9_000_000_000_000_000)),
            ] {
                let key = format!("script-test:{run}:{way}:{case}");
                let fence_key = format!("{key}:fence");
                if let Some(fence) = fence {
                    let _: () = redis::cmd("SET")
                        .arg(&fence_key)
                        .arg(fence)
                        .query_async(&mut conn)
                        .await
                        .expect("SET fence");
                }
                let before = server_micros(&mut conn).await;
                let Attempt::Granted { token } = acquire(&mut conn, &script, &key).await else {
                    panic!("{way}, {case}: a free key was refused");
                };
                let after = server_micros(&mut conn).await;
                match fence {
                    Some(ahead) if ahead > after => {
                        assert_eq!(token, ahead + 1, "{way}, {case}")
                    }
                    _ => assert!(
                        (before..=after).contains(&token),
                        "{way}, {case}: {token} not within the server's clock {before}..={after}"
                    ),
                }
                let stored: u64 = redis::cmd("GET")
                    .arg(&fence_key)
                    .query_async(&mut conn)
                    .await
                    .expect("GET fence");
                assert_eq!(stored, token, "{way}, {case}: the fence holds the token");
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&fence_key)
                    .query_async(&mut conn)
                    .await
                    .expect("PTTL fence");
                assert!(
                    (RETENTION_MS as i64 - 10_000..=RETENTION_MS as i64).contains(&pttl),
                    "{way}, {case}: the fence expires in {pttl} ms, not one retention window"
                );
                let Attempt::Held { expires_in } = acquire(&mut conn, &script, &key).await else {
                    panic!("{way}, {case}: a held key was granted again");
                };
                let left = expires_in.expect("the lock has a TTL");
                assert!(
                    left > Duration::from_secs(20) && left <= Duration::from_secs(30),
                    "{way}, {case}: {left:?}"
                );
                let _: () = redis::cmd("DEL")
                    .arg(format!("{key}:lock"))
                    .arg(&fence_key)
                    .query_async(&mut conn)
                    .await
                    .expect("DEL");
            }
        }
    }

    /// A fence at or ahead of the clock (as after many grants within one µs, or a clock set
    /// back) is passed by one at each grant.
    #[tokio::test]
    async fn a_fence_ahead_of_the_clock_is_passed_by_one_at_each_grant() {
        let mut conn = shared_connection().await;
        let run = OwnerId::random();
        for (way, text) in variants() {
            let script = Script::new(&text);
            let key = format!("script-test:{run}:{way}:same-µs");
            let mut last = 0;
            for _ in 0..50 {
                let Attempt::Granted { token } = acquire(&mut conn, &script, &key).await else {
                    panic!("{way}: a released key was refused");
                };
                assert!(token > last, "{way}: {token} after {last}");
                last = token;
                // Release, and put the fence a little ahead of the clock, as many grants in
                // one µs would.
                let _: () = redis::cmd("DEL")
                    .arg(format!("{key}:lock"))
                    .query_async(&mut conn)
                    .await
                    .expect("DEL lock");
                let ahead = server_micros(&mut conn).await + 1_000_000;
                let _: () = redis::cmd("SET")
                    .arg(format!("{key}:fence"))
                    .arg(ahead.max(last))
                    .query_async(&mut conn)
                    .await
                    .expect("SET fence");
                last = ahead.max(last);
            }
        }
    }

    /// The Cluster client resends a whole pipeline after an I/O error, so an acquire may run
    /// twice: the second run of a permit request (the same owner id) answers the grant the
    /// first made and takes no second slot, even when the first took the last one.
    #[tokio::test]
    async fn a_resent_permit_acquire_answers_its_grant_and_takes_one_slot() {
        let mut conn = shared_connection().await;
        let names = KeyNames::new(&format!("script-test:{}:", OwnerId::random()), "permits");
        let (ttl, retention) = (Duration::from_secs(30), Duration::from_millis(RETENTION_MS));
        let mode = Mode::permits(2);
        let holders = |conn: &mut redis::aio::MultiplexedConnection| {
            let cmd = redis::cmd("ZCARD").arg(&names.holders).clone();
            let mut conn = conn.clone();
            async move { cmd.query_async::<u64>(&mut conn).await.expect("ZCARD") }
        };
        let owner = OwnerId::random();
        let first =
            acquire_as_on(&mut conn, &names, owner, ttl, retention, mode, WINDOW, None).await;
        let resent =
            acquire_as_on(&mut conn, &names, owner, ttl, retention, mode, WINDOW, None).await;
        assert!(
            matches!(first, Ok(ModeAttempt::Granted { slot: Some(0), .. })),
            "{first:?}"
        );
        assert_eq!(resent.ok(), first.ok(), "the resend answers the same grant");
        assert_eq!(holders(&mut conn).await, 1, "one slot taken, not two");
        // Another owner takes the last slot; its resend still finds its grant.
        let other = OwnerId::random();
        let last =
            acquire_as_on(&mut conn, &names, other, ttl, retention, mode, WINDOW, None).await;
        assert!(
            matches!(last, Ok(ModeAttempt::Granted { slot: Some(1), .. })),
            "{last:?}"
        );
        let resent =
            acquire_as_on(&mut conn, &names, other, ttl, retention, mode, WINDOW, None).await;
        assert_eq!(
            resent.ok(),
            last.ok(),
            "a full key answers the resend its grant"
        );
        assert_eq!(holders(&mut conn).await, 2);
        let third = acquire_as_on(
            &mut conn,
            &names,
            OwnerId::random(),
            ttl,
            retention,
            mode,
            WINDOW,
            None,
        )
        .await;
        assert!(matches!(third, Ok(ModeAttempt::Held { .. })), "{third:?}");
    }

    /// The ms left of `key`'s expiry.
    async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(conn)
            .await
            .expect("PTTL")
    }

    /// Sets `key` to expire `ms` from now, as if its grant were older.
    async fn pexpire(conn: &mut redis::aio::MultiplexedConnection, key: &str, ms: u64) {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(ms)
            .query_async(conn)
            .await
            .expect("PEXPIRE");
    }

    /// The only holder's member of a holders set and the ms its score lies ahead of the
    /// server's clock.
    async fn only_holder(
        conn: &mut redis::aio::MultiplexedConnection,
        holders: &str,
    ) -> (String, i64) {
        let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(holders)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await
            .expect("ZRANGE");
        let [(member, score)] = &members[..] else {
            panic!("one holder expected, found {members:?}");
        };
        let now = server_micros(conn).await;
        (member.clone(), (*score as i64 - now as i64) / 1000)
    }

    /// Sets a holder's score to `ms` from now, as if its grant were that old.
    async fn rescore(
        conn: &mut redis::aio::MultiplexedConnection,
        holders: &str,
        member: &str,
        ms: u64,
    ) {
        let now = server_micros(conn).await;
        let _: i64 = redis::cmd("ZADD")
            .arg(holders)
            .arg("XX")
            .arg(now + ms * 1000)
            .arg(member)
            .query_async(conn)
            .await
            .expect("ZADD XX");
    }

    /// The Cluster client resends a command after an I/O error, so an exclusive acquire (the
    /// plain script and a waiter's) may run twice with one owner id. The second run finds the
    /// lock its first run set and takes it over: granted with a fresh token, the one the fence
    /// holds, its expiry counted from the resend, and a waiter's mark removed. Answering "held"
    /// instead left a lock no lease knew of until its TTL.
    #[tokio::test]
    async fn a_resent_exclusive_acquire_takes_its_own_lock_over_with_the_fences_token() {
        let mut conn = shared_connection().await;
        let prefix = format!("script-test:{}:", OwnerId::random());
        let (ttl, retention) = (Duration::from_secs(30), Duration::from_millis(RETENTION_MS));
        for waiting in [false, true] {
            let names = KeyNames::new(&prefix, &format!("resent-exclusive-{waiting}"));
            let owner = OwnerId::random();
            let waiter = "a-waiting-writer";
            let base = conn.clone();
            let run = || {
                let (mut conn, names) = (base.clone(), names.clone());
                async move {
                    if waiting {
                        let place = Place {
                            waiter,
                            arrival: 0,
                            mark: Duration::from_secs(1),
                        };
                        acquire_waiting_on(&mut conn, &names, owner, ttl, retention, place, None)
                            .await
                            .map(|(attempt, _)| attempt)
                    } else {
                        acquire_on(&mut conn, &names, owner, ttl, retention, None).await
                    }
                }
            };
            let Ok(Attempt::Granted { token: first }) = run().await else {
                panic!("waiting {waiting}: a free key was refused");
            };
            // As if the resend came 20 s later: the lock has 10 s left.
            pexpire(&mut conn, &names.lock, 10_000).await;
            let resent = run().await;
            let Ok(Attempt::Granted { token }) = resent else {
                panic!("waiting {waiting}: the resend answered {resent:?}, not a grant");
            };
            assert!(token > first, "waiting {waiting}: {token} after {first}");
            let fence: u64 = redis::cmd("GET")
                .arg(&names.fence)
                .query_async(&mut conn)
                .await
                .expect("GET fence");
            assert_eq!(fence, token, "waiting {waiting}: the fence holds the token");
            let left = pttl(&mut conn, &names.lock).await;
            assert!(
                left > 20_000,
                "waiting {waiting}: the resend left {left} ms, not the TTL from the resend"
            );
            let marks: u64 = redis::cmd("ZCARD")
                .arg(&names.writers)
                .query_async(&mut conn)
                .await
                .expect("ZCARD");
            assert_eq!(
                marks, 0,
                "waiting {waiting}: a granted waiter leaves no mark"
            );
            let (lock, channel) = (
                NameArg::Whole(names.lock.as_str().into()),
                NameArg::Whole(names.channel.as_str().into()),
            );
            let released = release_keys_on(&mut conn, &lock, &channel, owner).await;
            assert!(matches!(released, Ok(true)), "{released:?}");
            let next = acquire_on(&mut conn, &names, OwnerId::random(), ttl, retention, None).await;
            assert!(
                matches!(next, Ok(Attempt::Granted { .. })),
                "waiting {waiting}: {next:?}"
            );
        }
    }

    /// The second run of a shared request (the same owner id) answers the grant the first made,
    /// with its expiry counted from the resend, and adds no second reader, even once a writer
    /// marked itself meanwhile (which refuses new readers). A second reader kept writers out
    /// until its TTL.
    #[tokio::test]
    async fn a_resent_shared_acquire_answers_its_grant_and_adds_no_second_reader() {
        let mut conn = shared_connection().await;
        let names = KeyNames::new(&format!("script-test:{}:", OwnerId::random()), "readers");
        let (ttl, retention) = (Duration::from_secs(30), Duration::from_millis(RETENTION_MS));
        let owner = OwnerId::random();
        let first = acquire_as_on(
            &mut conn,
            &names,
            owner,
            ttl,
            retention,
            Mode::Shared,
            WINDOW,
            None,
        )
        .await;
        let Ok(first @ ModeAttempt::Granted { slot: None, .. }) = first else {
            panic!("a free key was refused: {first:?}");
        };
        // As if the resend came 2 s later, within the resend window.
        let (member, _) = only_holder(&mut conn, &names.holders).await;
        rescore(&mut conn, &names.holders, &member, 28_000).await;
        pexpire(&mut conn, &names.lock, 28_005).await;
        let resent = acquire_as_on(
            &mut conn,
            &names,
            owner,
            ttl,
            retention,
            Mode::Shared,
            WINDOW,
            None,
        )
        .await;
        assert_eq!(
            resent.ok(),
            Some(first),
            "the resend answers the same grant"
        );
        let (resent_member, left) = only_holder(&mut conn, &names.holders).await;
        assert_eq!(resent_member, member);
        assert!(left > 28_000, "the resend left {left} ms, not the TTL");
        let lock_left = pttl(&mut conn, &names.lock).await;
        assert!(lock_left > 28_005, "the tag expires in {lock_left} ms");
        // A writer marks itself: new readers are refused, the resend is not one.
        let now = server_micros(&mut conn).await;
        let _: i64 = redis::cmd("ZADD")
            .arg(&names.writers)
            .arg(now + 5_000_000)
            .arg("a-waiting-writer")
            .query_async(&mut conn)
            .await
            .expect("ZADD writers");
        let resent = acquire_as_on(
            &mut conn,
            &names,
            owner,
            ttl,
            retention,
            Mode::Shared,
            WINDOW,
            None,
        )
        .await;
        assert_eq!(resent.ok(), Some(first), "behind a writer's mark too");
        assert_eq!(only_holder(&mut conn, &names.holders).await.0, member);
        let other = acquire_as_on(
            &mut conn,
            &names,
            OwnerId::random(),
            ttl,
            retention,
            Mode::Shared,
            WINDOW,
            None,
        )
        .await;
        assert!(
            matches!(other, Ok(ModeAttempt::Held { .. })),
            "another reader is still refused behind the writer: {other:?}"
        );
    }

    /// A resent permit request answers its grant with the holder's expiry counted from the
    /// resend: a write, so a `WAIT` sent after it (`min_replicas`) counts the replicas that have
    /// the grant. A resend that wrote nothing, on the fresh connection the Cluster client
    /// resends on, had `WAIT` answer every replica at once, whatever they had received.
    #[tokio::test]
    async fn a_resent_permit_acquire_counts_its_expiry_from_the_resend() {
        let mut conn = shared_connection().await;
        let names = KeyNames::new(&format!("script-test:{}:", OwnerId::random()), "refresh");
        let (ttl, retention) = (Duration::from_secs(30), Duration::from_millis(RETENTION_MS));
        let (owner, mode) = (OwnerId::random(), Mode::permits(2));
        let first =
            acquire_as_on(&mut conn, &names, owner, ttl, retention, mode, WINDOW, None).await;
        assert!(
            matches!(first, Ok(ModeAttempt::Granted { .. })),
            "{first:?}"
        );
        let (member, _) = only_holder(&mut conn, &names.holders).await;
        rescore(&mut conn, &names.holders, &member, 10_000).await;
        pexpire(&mut conn, &names.lock, 10_005).await;
        let resent =
            acquire_as_on(&mut conn, &names, owner, ttl, retention, mode, WINDOW, None).await;
        assert_eq!(resent.ok(), first.ok(), "the resend answers the same grant");
        let (_, left) = only_holder(&mut conn, &names.holders).await;
        assert!(
            left > 20_000,
            "the resend left the holder {left} ms, not the TTL"
        );
        let lock_left = pttl(&mut conn, &names.lock).await;
        assert!(lock_left > 20_000, "the tag expires in {lock_left} ms");
    }

    #[test]
    fn owner_hex_is_the_display_form() {
        for id in [
            0u128,
            1,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let owner = OwnerId::parse(&format!("{id:032x}")).expect("32 hex digits");
            assert_eq!(owner_hex(owner), owner.to_string().as_bytes(), "{id:#x}");
        }
        let owner = OwnerId::random();
        assert_eq!(owner_hex(owner), owner.to_string().as_bytes());
    }
}
