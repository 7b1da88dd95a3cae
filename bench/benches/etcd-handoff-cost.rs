//! Instructions per handoff on the client, for `valgrind --tool=callgrind`: `waiters` contenders
//! on one current-thread runtime take and give back one key until `n` handoffs, against the
//! server at `ETCD_URL` (an `etcd://` URL; the peer uses its endpoints).
//!
//! ```text
//! scripts/bench.sh --build etcd-handoff-cost
//! valgrind --tool=callgrind target/bench/bin/etcd-handoff-cost ours 200
//! valgrind --tool=callgrind target/bench/bin/etcd-handoff-cost ours 600
//! ```
//! The difference of the two totals over 400 is one handoff's cost on the client, start-up
//! excluded. Contenders: `ours` (the store through `DynLockStore`, one handle per waiter, as
//! the bench measures it) and `peer` (etcd's lock service: `lock()` until granted, `unlock()`,
//! one client and lease per waiter). Two more measure one waiter's watches alone, `n` times on
//! one client: `stream` opens a watch stream per wait with two watches (a predecessor's
//! deletion and an entry), waits for both to be created and drops the stream; `shared` does
//! the same on one stream kept open, cancelling both watches after each wait.
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, LockOptions};
use fencelock_bench::{handoff, handoff_between, Contender, Handoff};
use fencelock_core::DynLockStore;
use fencelock_etcd::{EtcdConfig, EtcdStore};

const TTL: Duration = Duration::from_secs(30);
const WAITERS: usize = 4;

struct PeerWaiter {
    client: Client,
    lease: i64,
    name: String,
}

fn peer_error(error: etcd_client::Error) -> fencelock_core::Error {
    fencelock_core::Error::Store {
        message: format!("peer: {error}"),
        source: None,
    }
}

#[async_trait]
impl Contender for PeerWaiter {
    type Held = Vec<u8>;

    async fn take(&mut self) -> fencelock_core::Result<Vec<u8>> {
        let options = LockOptions::new().with_lease(self.lease);
        let locked = self
            .client
            .lock(self.name.as_str(), Some(options))
            .await
            .map_err(peer_error)?;
        Ok(locked.key().to_vec())
    }

    async fn give_back(&mut self, key: Vec<u8>) -> fencelock_core::Result<()> {
        self.client.unlock(key).await.map(drop).map_err(peer_error)
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = fencelock_bench::args();
    let which = args.next().unwrap_or_else(|| "ours".into());
    let n: usize = args.next().map_or(Ok(200), |n| n.parse())?;
    let url = std::env::var("ETCD_URL").map_err(|_| "set ETCD_URL to an etcd:// URL")?;
    let config = EtcdConfig::from_url(&url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let key = format!("cost-{}", std::process::id());
    runtime.block_on(async move {
        match which.as_str() {
            "ours" => {
                let mut handles: Vec<DynLockStore> = Vec::new();
                for _ in 0..WAITERS {
                    handles.push(Arc::new(EtcdStore::connect(config.clone()).await?));
                }
                handoff(handles, &key, TTL, n).await?;
            }
            "peer" => {
                let mut peers = Vec::new();
                for _ in 0..WAITERS {
                    let mut client = Client::connect(config.endpoints(), None).await?;
                    let lease = client.lease_grant(60, None).await?.id();
                    let name = format!("cost/peer/{key}");
                    peers.push(PeerWaiter {
                        client,
                        lease,
                        name,
                    });
                }
                handoff_between(peers, n, Handoff::AnyWaiter).await?;
            }
            "stream" | "shared" | "shared1" | "merged" => {
                use etcd_client::{WatchFilterType, WatchOptions};
                let mut client = Client::connect(config.endpoints(), None).await?;
                let pred = format!("{key}/pred");
                let own = format!("{key}/own");
                let nopt = || WatchOptions::new().with_filters([WatchFilterType::NoPut]);
                if which == "stream" {
                    for _ in 0..n {
                        let mut stream = client.watch(pred.as_str(), Some(nopt())).await?;
                        stream.watch(own.as_str(), None).await?;
                        for _ in 0..2 {
                            stream.message().await?.ok_or("ended")?;
                        }
                    }
                } else if which == "merged" {
                    // As `shared`, but each wait's cancellations go out with the next wait's
                    // creations.
                    let mut stream = client.watch("x", None).await?;
                    stream.message().await?;
                    let mut id = 100;
                    for _ in 0..n {
                        if id > 100 {
                            stream.cancel(id - 2).await?;
                            stream.cancel(id - 1).await?;
                        }
                        stream
                            .watch(pred.as_str(), Some(nopt().with_watch_id(id)))
                            .await?;
                        let options = WatchOptions::new().with_watch_id(id + 1);
                        stream.watch(own.as_str(), Some(options)).await?;
                        let mut created = 0;
                        while created < 2 {
                            let message = stream.message().await?.ok_or("ended")?;
                            created += usize::from(message.created());
                        }
                        id += 2;
                    }
                } else {
                    let mut stream = client.watch("x", None).await?;
                    stream.message().await?;
                    let mut id = 100;
                    for _ in 0..n {
                        stream
                            .watch(pred.as_str(), Some(nopt().with_watch_id(id)))
                            .await?;
                        stream
                            .watch(
                                own.as_str(),
                                Some(WatchOptions::new().with_watch_id(id + 1)),
                            )
                            .await?;
                        for _ in 0..2 {
                            stream.message().await?.ok_or("ended")?;
                        }
                        stream.cancel(id).await?;
                        stream.cancel(id + 1).await?;
                        for _ in 0..2 {
                            stream.message().await?.ok_or("ended")?;
                        }
                        id += 2;
                    }
                }
            }
            other => return Err(format!("unknown contender {other}: ours or peer").into()),
        }
        Ok::<_, Box<dyn Error>>(())
    })
}
