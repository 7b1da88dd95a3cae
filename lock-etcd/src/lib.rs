//! fencelock on etcd v3 (3.4 or newer): an etcd lease per lock, all kept alive over one stream
//! per handle, the holder entry's create revision plus a clock-raised per-prefix offset as the
//! fencing token, and a fair queue in the manner of etcd's own Go recipe
//! (`client/v3/concurrency.Mutex`).
//!
//! ```no_run
//! # async fn demo() -> fencelock_core::Result<()> {
//! use std::time::Duration;
//! use fencelock_core::{Acquire, Release};
//! use fencelock_etcd::{EtcdConfig, EtcdStore};
//!
//! let config = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")?;
//! let store = EtcdStore::connect(config).await?;
//! let lease = store.acquire("nightly-export", Duration::from_secs(30), Duration::from_secs(5)).await?;
//! // ... every write carries lease.fencing_token() ...
//! store.release(&lease).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! - **A queue per key.** The lock on `key` is the key-space directory
//!   `{prefix}{key}/` (`%` and `/` in the key escaped as `%25` and `%2F`, so no key's directory
//!   holds another key's entries). Each acquisition grants its own etcd lease and puts one entry
//!   `{prefix}{key}/{owner id}` on it, in a transaction that also reads the directory's oldest
//!   entry. The entry with the lowest create revision holds the lock; the others wait.
//! - **The fencing token** is `O + R`: `R` the holder entry's create revision (assigned by
//!   Raft, cluster-wide and strictly increasing), `O` the prefix's *token offset* as of that
//!   revision, read in the transaction that created the entry. `O` only ever rises, so tokens
//!   follow create revisions. A later holder's entry is always younger than every earlier
//!   holder's (an entry only becomes the holder once every older one is gone), so tokens grow
//!   per key across release, expiry, eviction and leader changes. `O` is raised from the
//!   client's clock so that tokens stay at the clock in µs, as every other store's do (see
//!   *Tokens across a swap*); release, extend, evict and the handoff compare `R` itself, which
//!   each lease carries.
//! - **The TTL is the etcd lease's**: whole seconds, rounded up, at least 1 s. etcd raises a
//!   shorter TTL to its own minimum (about 1.5 × the election timeout, 2 s with the default
//!   settings); [`Lease::ttl`](fencelock_core::Lease::ttl) reports the TTL etcd actually granted.
//!   etcd deletes the entry when the lease expires. A lease is never kept alive on its own: only
//!   [`Extend::extend`](fencelock_core::Extend::extend) (and so [`fencelock_core::KeepAlive`]) renews it,
//!   so a lock nobody extends expires at its TTL.
//! - **One keep-alive stream per handle.** etcd's `LeaseKeepAlive` stream takes any lease id in
//!   each request. Every extend of every lock of a handle (and every waiter's renewal) goes
//!   over that one stream, opened on first use and reopened when it breaks; an answer with
//!   TTL 0 means the lease is gone. Keep-alive traffic is one small message per lock per
//!   extend (every TTL/4 under `KeepAlive`), never a stream or connection per lock.
//! - **Waiting** is etcd's recipe: a waiter watches only its predecessor (the newest entry
//!   older than its own) for deletion, so a release wakes exactly one waiter (no thundering
//!   herd). The enqueue transaction itself names the predecessor (it reads the queue's two
//!   newest entries at the revision of the put: ours, and the one before it), so a waiter
//!   starts watching without another read. The watch starts at the current revision — etcd
//!   serves a watch from a past revision as "unsynced" and catches it up only every 100 ms,
//!   which would delay wake-ups — and the gap since the queue was read is closed by reading
//!   the predecessor again once the watch exists, unless the watch's creation reply shows no
//!   write since that read (etcd starts a watch without a start revision right after the
//!   revision its creation reply names). That read is serializable (no consensus round) and
//!   counts only if the member answered at or after the watch's revision, as the member that
//!   created the watch has; otherwise it is made linearizable. When the enqueue showed the
//!   predecessor certainly waiting (an exclusive entry behind the head: only the head holds
//!   an exclusive lock; a reader's or a permit's entry behind it may hold the key, and so may
//!   an entry of a nested name in the etcd layout, `a/b/…` in `a/`'s directory), that read
//!   is put off by 50 ms and dropped if the wait ends first (in a long queue it usually does,
//!   by a handoff): such a predecessor leaves within the gap only if it gives up, its lease
//!   ends, or it is granted and released within about one round trip, and a deletion missed
//!   then delays the waiter by those 50 ms, never lets it through early. In the 8-waiter
//!   bench this took the reads per handoff from 0.70 to 0.01 (etcd's gRPC counters). After
//!   each deletion the waiter reads the queue again in one transaction (the predecessor, and
//!   its own entry), because the deleted entry may have been a waiter that gave up while an
//!   older holder remains. Every wait of a handle watches over the handle's one watch
//!   stream, as etcd's Go client does: a wait creates its watches on it and cancels them when
//!   it ends, instead of opening a stream of its own (a stream per wait cost the client 46k
//!   instructions and etcd about 110 µs of CPU more per wait: `examples/handoff_cost.rs`).
//!   An exclusive wait's watches send nothing once it is over, so their cancellation goes out
//!   with the next wait's creations (within 1 s): etcd's CPU goes by the exchanges on a stream
//!   more than by the watches in each, and that saves it about 150 µs per wait. The
//!   stream opens with the first wait, closes after 30 s without a watch, and a break ends
//!   every wait's watches at once, each of which then reads again, as below. A watch that is
//!   cancelled or refused (a stream's auth token gone stale: the stream is closed, see
//!   `watcher.rs`), or a stream that breaks (a member that lost its leader ends it: the
//!   client requires a leader), makes the waiter re-read the queue instead of failing. The
//!   waiter renews its own lease every TTL/3 while it waits, and once more together with the
//!   final read (unless the last confirmed renewal is less than TTL/6 old), so the lease it
//!   returns is measured from a recent renewal, not from the grant; a renewal without an
//!   answer (an election) is retried while the last confirmed one still covers the lease.
//! - **Before returning after a wait**, the waiter's final read confirms its own entry still
//!   exists with its own lease and revision (Jepsen's etcd 3.4.3 finding: a waiter whose lease
//!   expired must not believe it holds the lock). If the entry is gone, it queues again, at the
//!   back, within the same wait bound (a request without a wait: within one command timeout
//!   of its start). A watch's creation and the reads made while watching end at that bound
//!   too; past it, a wait only finishes the requests it has in flight (each bounded by the
//!   command timeout) and returns. A handoff (below) is the one grant without that read: the
//!   transaction that hands over proves the same facts.
//! - **Release** deletes the entry only if its create revision is still the one the lease
//!   was granted on (a retried, stale unlock never deletes a newer holder; etcd issue 22082). The lock's etcd
//!   lease then holds nothing and no other lock uses it: it is kept, idle and not kept alive,
//!   for the next acquire with the same TTL on this handle (at most 8 per TTL, and only while at
//!   least half its TTL is left); otherwise it is revoked from a spawned task. A lease whose
//!   release found it lost is always revoked.
//! - **Handoff** ([`Layout::Fencelock`], exclusive locks). A waiter's final read also lists
//!   the exclusive entries right behind its own (up to 8, oldest first, stopping at a reader
//!   or a permit): its *successors*. When it releases, one transaction deletes its entry (on
//!   the token comparison above) and, if the first successor's entry still has the create
//!   revision and the lease that read saw, rewrites that entry's value to a *handoff mark* on
//!   that same lease; the mark lists the remaining successors, so the new holder can hand off
//!   in turn. Each waiter watches its own entry's puts next to its predecessor's deletions,
//!   over the same watch stream, and the put event of a mark on its own entry, with its own create revision and
//!   lease, is its grant: no read after the wake-up, where etcd's `Lock` RPC reads the queue
//!   again. The predecessor's delete event (same revision, the other watch) may come first:
//!   the waiter then reads the queue as always, and takes whichever answer comes first, the
//!   mark or the read; either is a correct grant. Why a mark is one, at the mark's revision
//!   `D`:
//!   - *the marked entry is the oldest live entry at `D`*: the releaser's entry still had its
//!     token at `D`, so it was the holder, the oldest entry (no entry older than a holder ever
//!     appears again: create revisions only grow). The successor list came from one read at a
//!     revision `G` at which no entry lay between the releaser's and the marked one in create
//!     order, nor between consecutive successors; every entry created after `G` is newer than
//!     all of them, and deleted entries never come back. So once the releaser's entry is
//!     deleted at `D`, the marked entry is the oldest;
//!   - *a waiter whose entry or lease vanished is never handed the lock*: the mark is written
//!     only if the entry exists at `D` with the create revision and the lease the read saw (a
//!     revoked lease took its entry with it; an entry deleted by hand fails the comparison,
//!     and the put never writes it back). The waiter accepts only a mark on its own entry with
//!     its own create revision and lease, and one event on one watch carries all of it, so no
//!     ordering between watches is assumed;
//!   - *the token* is the offset plus the entry's create revision, as for any grant (the
//!     offset as its enqueue read it), and grants still happen in create-revision order;
//!   - *compaction or a broken watch* cancels the waiter's watches: it re-reads the queue as
//!     before. A mark written while it was not watching (between its read and its watches)
//!     came with its predecessor's deletion, which the read after the watches exist finds, and
//!     the read then grants it as always.
//!
//!   A successor that gave up makes the comparison fail: the release then only deletes, and
//!   the waiters behind wake and read as before. A holder that knows no successor (granted at
//!   once, by `try_acquire` or by an `acquire` that found the queue empty, or with every
//!   listed one used up) releases with the plain delete, so in a queue the first handoff comes
//!   after the first grant that followed a wait. In
//!   `layout=etcd` nothing is marked: etcd's own clients know no mark.
//! - **Reusing an idle lease** saves the grant (a Raft write): the acquire sends a keep-alive
//!   for it over the stream in parallel with the enqueue transaction, both after `sent_at`, and
//!   uses it only if etcd confirms it alive; if it ended while idle (expired, revoked), its entry
//!   went with it and the acquire starts over with a fresh lease. A lease whose last confirmed
//!   renewal (or grant) was sent less than a tenth of its TTL ago is reused without the
//!   keep-alive: the new lock's local deadline is measured from that earlier confirmation
//!   (etcd keeps the lease at least a TTL from it), and a lease etcd no longer knows fails the
//!   enqueue's put ("lease not found"), which starts over with a fresh lease. An idle lease
//!   carries at most one lock at a time.
//! - **Extend** renews the lease over the stream and, in parallel, reads the entry: it fails
//!   with `LeaseLost` if etcd answers TTL 0 or the entry is gone or has another revision. The
//!   new local deadline is measured from a clock reading taken before both were sent.
//!
//! # Semaphores and reader-writer locks
//! [`Acquire::try_acquire_as`](fencelock_core::Acquire::try_acquire_as) and
//! [`Acquire::acquire_as`](fencelock_core::Acquire::acquire_as) keep shared leases (readers)
//! and semaphore permits ([`Mode`](fencelock_core::Mode)) in the key's **one** queue, next to
//! the exclusive entries, each entry on its own etcd lease, in the manner of etcd's
//! `recipes.RWMutex`:
//! - a reader's entry is `{prefix}{key}/~r/{owner id}`, a permit's `{prefix}{key}/~p/{owner
//!   id}` (owner ids are hexadecimal, so every entry that is not a reader's sorts before
//!   `~r/`: a reader reads the writers older than itself as one range). The entry is put
//!   *waiting* (its value says the mode, and a permit's limit), and holds once a transaction
//!   has **marked it granted**: rewritten its value on the same lease, keeping its create
//!   revision, on the condition that the entry still exists with that revision;
//! - **a reader** is marked once a read at one revision finds no older entry that is not a
//!   reader's and the newest older reader marked (so every older one: each was marked only
//!   after the readers before it). It waits for earlier writers only;
//! - **a writer** is unchanged: it holds when its entry is the oldest, so it waits for
//!   everything earlier, readers and permits included;
//! - **a permit of `L`** is marked once every older entry is a marked permit of `L` and there
//!   are fewer than `L` of them; it takes the lowest slot in `0..L` none of them occupies,
//!   recorded in its value. Two permits never share a slot: a permit is marked only after
//!   every older one, from a snapshot in which every older permit's slot is recorded, and no
//!   newer permit can be marked before it. A free slot always exists: fewer than `L` older
//!   entries, and no newer one marked.
//!
//! **The writer policy is FIFO**, which meets the one in [`Mode`](fencelock_core::Mode): a
//! reader that arrives after a waiting writer has that writer's entry older than its own, so
//! it queues behind it; readers that already hold keep their leases until they release or
//! expire. A writer that gives up revokes its entry and so stops keeping readers out at once.
//!
//! **Tokens** are the offset plus the entries' create revisions in every mode, and every grant
//! happens in create-revision order (an entry is granted only once every older entry is gone or
//! was granted before it), so every lease's token is greater than every token granted for the
//! key before, across modes. Within one slot tokens only grow.
//!
//! **The limit** is in each permit's value. A permit request that finds a *granted* older
//! permit with another limit fails with
//! [`Error::LimitMismatch`](fencelock_core::Error::LimitMismatch) (its entry revoked); a
//! waiting one with another limit is about to be refused the same way, and is waited for. Once
//! every permit is gone, a new limit may be set.
//!
//! **Waiting**: a waiter watches only entries older than its own, never the newer keys: a
//! reader the one entry that blocks it (the newest older writer, or the newest older reader
//! not yet marked), a permit every older entry (any of them may free a slot, or a place among
//! the `L` oldest), all over the handle's one watch stream, up to 1024 watches (past that it also reads the
//! queue again at every renewal). The watches start at the current revision and the view is
//! read again once they exist, as for the exclusive waiter.
//!
//! **Without a wait**, `try_acquire_as` is [`Error::Busy`](fencelock_core::Error::Busy) at
//! once when a writer, a reader (for a permit), another limit's request or `L` older entries
//! are in front, and its entry is revoked before it returns: it leaves nothing queued. Only
//! when what is in front is compatible requests between their enqueue and their mark (two
//! readers arriving together) does it wait for them, at most the command timeout.
//!
//! Release, extend, evict and the lease's TTL are those of an exclusive lease (release deletes
//! the entry if its create revision is still the token; evict frees the oldest entry).
//! [`LockStore::status`] reports
//! [`KeyStatus::Shared`](fencelock_core::KeyStatus::Shared) with every marked reader or permit
//! (owner, token, slot, and for the first 32 the lease's remaining TTL). Each mode grant costs
//! one more transaction than an exclusive one (the mark), and a read of the entries ahead.
//!
//! Modes are kept only in [`Layout::Fencelock`]: with `layout=etcd`,
//! [`Capabilities`](fencelock_core::Capabilities) declare neither, and both are refused with
//! [`Error::Unsupported`](fencelock_core::Error::Unsupported). etcd's own clients know only
//! exclusive entries and would take a reader's entry for a holder of theirs (safe, but a
//! reader would then block `etcdctl lock`), and etcd's `RWMutex` recipe names its `read` and
//! `write` keys in a layout of its own.
//!
//! # Next to etcd's own lock clients: `layout=etcd`
//! With [`Layout::Etcd`] (URL option `layout=etcd`) every name is the one etcd's Go recipe
//! uses: the queue of `key` is `{prefix}{key}/` (prefix empty by default, the key not
//! escaped) and each entry is `{prefix}{key}/{etcd lease id in hex}` on the lease that carries
//! it, exactly what `concurrency.NewMutex(session, key)`, `etcdctl lock key` and the server's
//! `Lock` RPC put. The algorithm was already theirs (the oldest create revision holds, each
//! waiter watches its predecessor), so fencelock and those clients on the same name exclude each
//! other in both directions and wait in one FIFO queue. The key is not escaped, as theirs is
//! not: the queue of `a` also holds the entries of `a/b` (a holder of `a/b` makes `a` wait;
//! false contention, never two holders).
//!
//! **The token** in this layout is the store revision of the reply that granted the lock: the
//! enqueue transaction's header if the entry was first at once, otherwise the header of the
//! read that found no older entry and our own still there. That is the number etcd's `Mutex`
//! keeps as `Header().Revision` and `etcdctl lock` exports as `ETCD_LOCK_REV`, so a resource
//! fenced by both kinds of client refuses either side's stale writes. It grows with every
//! grant, whoever's: a grant's reply shows its entry as the oldest, so the entry of every
//! earlier holder is gone by then, deleted at a revision above that holder's own grant reply
//! (its entry still existed at that revision, and a delete makes a new one); the new reply is
//! read at or after that delete. It is not the entry's create revision, which for a holder that
//! had to queue is below the grants of those ahead of it. [`mutex_key`] gives a lease's
//! `ETCD_LOCK_KEY`; [`LockStore::status`](fencelock_core::LockStore::status) names no token in this
//! layout (etcd keeps none) and no owner (the entry names a lease).
//!
//! # Tokens across a swap
//! A resource fenced under another store must accept this store's first lease after a swap,
//! and the other store's after a swap back (issue 33). Every other store mints
//! `max(previous + 1, clock in µs)`; etcd has no server clock, and its tokens stay revisions,
//! lifted by the prefix's **token offset** `O` (the key `{prefix}~offset`, 19 zero-padded
//! digits, in [`Layout::Fencelock`] only):
//! - **The enqueue carries the raise.** The transaction that creates an entry first puts
//!   `O = c − h` if `O` is absent or below `c − G − h`, then reads `O` back: `c` the client's
//!   clock in µs read before sending it, `h` a store revision at most the entry's own (the last
//!   one an answer showed this handle, if at most 1 s old; otherwise a serializable read, which
//!   no consensus round backs, fetches one first). Raised, the token is `c − h + R > c`;
//!   not raised, `O ≥ c − G − h`, so the token is above `c − G`. Either way **a token is
//!   above its client's clock, read before its enqueue, less `G`**. A handle in use sends
//!   nothing more than before; one silent for a second sends that read. The raise is a
//!   comparison inside the transaction: it never fails or retries, and it writes once per
//!   granule on a busy prefix (enqueues that find `O` raised meanwhile compare false).
//! - **Strictly increasing.** `O` is only ever raised, in whole transactions, so the offset
//!   as of revision `R` never falls as `R` grows, and `O + R` strictly grows with `R`; grants
//!   follow create revisions in every mode. A resent enqueue (the put keeps the entry's create
//!   revision) takes `O` as of that revision, read from etcd's history if it changed since
//!   (that read fails if the revision was compacted away; the acquire then fails and its
//!   lease is revoked). [`LockStore::status`] names each holder's token the same way (none
//!   once compacted).
//! - **`G`, etcd's granule, is 100 ms.** **Runahead** (how far tokens run ahead of the clock
//!   of the client that raised): the revisions written between `h` and the entry, at most the
//!   cluster's writes in 1 s plus a round trip (50 ms at the 50,000 writes/s etcd reaches at
//!   best), since revisions grow far slower than 1 per µs. A client whose clock leads raises
//!   `O` by its lead: count it in the skew, which for etcd is between the *clients'* clocks and
//!   the other store's.
//! - **The swap delay `D`**: from store `A`'s last grant to the *start* of etcd's first
//!   acquire (its enqueue, which fixes the token even if it then waits),
//!   `D > skew + runahead(A) + 100 ms`; from etcd's last grant to `B`'s first,
//!   `D > skew + runahead(etcd) + G(B)`, the skew between any etcd client's clock and `B`'s.
//!   Every step of a round trip `A → etcd → A` is one of these.
//! - **No retention bound, no `max_skew`.** etcd deletes no fence state: entries go with their
//!   leases and the offset stays, one key per prefix (never delete it: the next raise would
//!   start from the clock, below tokens a leading clock set). So no clock decides between two
//!   tokens of this store, and there is no window for a skew to undercut; clocks only enter
//!   `D`. A client's clock stepping back raises nothing until it is a granule past the tokens again; one
//!   stepping forward by years lifts every later token with it (offsets stop at 2^62, so
//!   tokens stay below 2^63; a clock past that is refused).
//! - **Switching a prefix over.** Builds before this one mint raw revisions (about 10^3 to
//!   10^9), far below the new tokens (about 1.8·10^15). A prefix switches at the first grant of
//!   this build on it, which creates the offset at the clock: tokens jump once, upward. Stop or
//!   upgrade every older client of the prefix first: one left running gets raw revisions,
//!   which a resource fenced by this build then refuses (safe, not available). The two still
//!   exclude each other (an older build reads this build's entries as exclusive ones), only
//!   their tokens disagree. This build tells such a client's entries by their empty value
//!   (this build's exclusive entries hold `exclusive`; etcd's own clients put the empty value
//!   too): one at the head of the queue or right before its own entry makes the acquire fail
//!   with [`Error::Store`](fencelock_core::Error::Store) naming the fix, its entry revoked.
//!   An entry a handoff mark rewrote, or an older build's reader or permit, is not seen. An
//!   offset that is not 19 digits (a later scheme's marker, which should sort above them so
//!   this build never overwrites it, or a hand edit) is refused the same way.
//! - **`layout=etcd` is outside this.** Its tokens stay the raw revisions etcd's own clients
//!   see (`ETCD_LOCK_REV`); it reads and writes no offset, and no URL option changes that. A
//!   resource fenced under it and then under another store is fenced afresh: a swap back to
//!   raw revisions finds them far below.
//!
//! `tests/clock_floor.rs` checks each of these on a real server: the first token on a fresh
//! prefix at the clock, tokens growing in every mode and across idle granules, `status` after
//! a raise, `layout=etcd` untouched, and the refusals.
//!
//! # What is guaranteed
//! - At most one holder per key at any instant, across every client of the cluster, while the
//!   cluster has a quorum: the holder is whoever owns the oldest entry, and Raft orders every
//!   entry.
//! - Tokens only grow per key, including across leader elections and member loss (they are
//!   revisions, which a cluster never reuses, plus an offset that never falls), and stay
//!   below 2^63.
//! - A lease's local deadline (`sent_at + ttl − drift`) is never later than etcd's expiry: the
//!   leader starts (or restarts) the lease's TTL when it handles the grant or renewal, after
//!   `sent_at`. A new leader restarts every lease's TTL, which only lengthens it. Across a
//!   leader that stalls for longer than a TTL, only on etcd 3.4.31 / 3.5.13 and later (see
//!   *Early frees*).
//! - The lost signal of [`fencelock_core::KeepAlive`] fires when renewals cannot be confirmed before
//!   the local deadline, which is before etcd expires the lease — etcd's own
//!   `Session.Done` fires only after.
//! - Every request is bounded by `command_timeout` (connecting by `connect_timeout`): a stopped
//!   or unreachable cluster gives a retryable [`Error::Unavailable`](fencelock_core::Error) in time,
//!   never a hang. The client asks for a leader on every request, so a member cut off from
//!   its quorum answers "no leader" at once.
//!
//! # What is not
//! - Like every lock, no protection against a holder that keeps working past its deadline:
//!   check the fencing token at the resource.
//! - **Early frees.** A lock is freed before its holder's local deadline when its etcd lease is
//!   revoked behind the holder's back (`etcdctl lease revoke`, [`LockStore::evict`]), its entry
//!   is deleted by hand, or the cluster is restored from a snapshot taken before the grant. The
//!   holder learns of it at its next extend, within a third of the TTL under
//!   [`fencelock_core::KeepAlive`].
//! - **A stalled leader on etcd before 3.4.31 / 3.5.13** (Debian bookworm ships 3.4.23) frees
//!   locks early too: a leader stopped (`SIGSTOP`, a stuck disk) for longer than a lease's TTL
//!   finds, when it runs again, that lease expired in its own view and proposes its revoke; the
//!   proposal is forwarded to the new leader and committed (etcd issue 15247), deleting entries
//!   whose renewals the new leader had confirmed, whether holders' or waiters'. No request of a
//!   client prevents it. The holder learns of it at its next extend, and the next holder's
//!   token is greater; a waiter that had just been granted the lock may hold it for less than
//!   a TTL. The test `stopped_member` shows it (6 of 16 locks freed on 3.4.23) and asserts no
//!   lock is freed on a fixed server.
//! - **A cluster restored from a snapshot** reissues the revisions after the snapshot (and
//!   takes the token offset back to its value then), so tokens go backwards: a resource that already accepted a token above the snapshot's
//!   revision refuses every holder until the revisions pass it again, and a holder may get a
//!   token an older holder already had. Restore with `etcdutl snapshot restore --bump-revision
//!   N --mark-compacted` (etcd 3.5 and later), with `N` above the revisions issued since the
//!   snapshot, to keep tokens growing. Debian's etcd 3.4 has no such flag: there, a restore
//!   must be followed by enough writes (or fencing resources reset) before locks are used.
//! - A holder whose process dies keeps the lock until its lease's TTL runs out
//!   (`frees_on_disconnect` is false): etcd leases do not end with a connection.
//! - etcd expires leases in batches (the leader checks about every 500 ms), so a key may stay
//!   held up to about half a second past its TTL; never shorter.
//! - etcd's minimum lease TTL depends on the cluster's election timeout; on a slow-election
//!   cluster a 1 s request is granted more, which [`Lease::ttl`](fencelock_core::Lease::ttl) shows.
//! - A waiter whose own lease ends while it waits (its handle was cut off for a whole TTL) loses
//!   its place in the queue and queues again at the back.
//! - Keep-alive traffic grows with the number of held locks (one message per lock per extend,
//!   all over one stream per handle); leases are not shared between locks, so each lock can
//!   expire, be extended and be evicted on its own.
//! - Idle leases are not revoked when a handle is dropped: they hold no keys and expire at their
//!   TTL.
//!
//! # Cancel safety
//! An acquire future owns its etcd lease until it returns. Dropped at any point, it revokes
//! that lease from a spawned task, which deletes its queue entry at once: a dropped waiter stops
//! holding its place and never takes the lock later. If the runtime is gone or the cluster
//! cannot be reached, the lease is not renewed and expires at its TTL instead. Extend and
//! release may be dropped at any point; see each method's `# Cancel safety`.
//!
//! # Operator actions
//! [`LockStore::evict`] deletes the entry that holds a key and revokes its lease, as an
//! administrator's `etcdctl del` would: the key passes to the next waiter at once and the
//! holder finds out at its next extend. For fault tests and tooling; a holder never needs it.
//!
//! # The URL
//! `etcd://[user:pass@]host:port[,host:port…][?prefix=…&layout=…&connect_timeout=…&command_timeout=…]`,
//! or `etcds://…` for TLS (crate feature `tls`, rustls with the webpki roots): see
//! [`EtcdConfig`].
//!
//! # Server requirements
//! etcd 3.4 or newer with the v3 API. With authentication on, the user needs a role with
//! `readwrite` on the prefix (default `fencelock/`; with `layout=etcd` and its empty prefix, on
//! each lock's name), and nothing else: every key the store reads or writes is under it (each
//! lock's queue directory `{prefix}{escaped key}/` and its entries, and the prefix's one token
//! offset `{prefix}~offset`; there are no other keys).
//! Leases need no permission (revoking one needs write on the keys attached to it, which are
//! the store's own). [`LockStore::status`] and [`Extend::extend`] need only `read`. The test
//! `least_privilege` runs the conformance suite as such a user:
//!
//! ```sh
//! etcdctl role add fencelock
//! etcdctl role grant-permission fencelock --prefix=true readwrite fencelock/
//! etcdctl user add locks
//! etcdctl user grant-role locks fencelock
//! ```
//!
//! An operation etcd refuses for a missing right fails with a non-retryable
//! [`Error::Store`](fencelock_core::Error) that names the operation, the key it touched and the
//! right the user needs (etcd's own "permission denied" names none of them). After any change
//! to users or roles etcd refuses the tokens issued before it (with JWT tokens, until they
//! expire); the store then fetches a fresh token and sends the refused request again, which
//! etcd had not applied.
//!
//! [`Extend::extend`]: fencelock_core::Extend::extend
//! [`LockStore::status`]: fencelock_core::LockStore::status
//!
//! [`LockStore::evict`]: fencelock_core::LockStore::evict
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Module order (each imports only from those before it): config, error, keys, modes, handoff, offset, txn, renewer, store, descriptor.
mod config;
mod descriptor;
mod error;
mod handoff;
#[cfg(test)]
mod handoff_tests;
mod keys;
mod modes;
mod offset;
mod renewer;
mod store;
mod txn;
mod watcher;

pub use config::{
    EtcdConfig, Layout, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT,
    DEFAULT_PREFIX, MIN_TTL,
};
pub use descriptor::ETCD;
pub use store::{mutex_key, EtcdStore};

/// Whether etcd server `version` (as `"3.4.23"`) has the stale-leader lease revocation of etcd
/// issue 15247: a leader stopped past a lease's TTL and then resumed revokes the leases it
/// believes expired, though a newer leader kept them alive, which frees their locks early.
/// Fixed in 3.4.31 and 3.5.13. An unparseable version counts as affected.
pub fn stale_leader_revokes_leases(version: &str) -> bool {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    match (major, minor) {
        (3, 4) => patch < 31,
        (3, 5) => patch < 13,
        (3, minor) => minor < 4,
        (major, _) => major < 3,
    }
}
