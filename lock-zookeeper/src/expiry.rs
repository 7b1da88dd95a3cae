//! A granted lease's one background task: the expiry that deletes the lock node at the lease's
//! local deadline, so a lease nobody extends ends at its TTL while its process lives (the
//! session's expiry is the backstop when the process dies).

use fencelock_core::raw::LeaseExt;
use fencelock_core::Lease;
use tokio::time::Instant;

use crate::held::{Held, Phase};

/// Starts the expiry of `lease`: at the TTL, less its drift, after its last acquire or extend
/// was sent ([`Held::hold_until`], at or past its local deadline) it is marked expired and its
/// node deleted, retried every 100 ms while the session lives.
pub(crate) fn start_expiry(lease: Lease) {
    tokio::spawn(async move {
        let Some(held) = lease.store_state::<Held>() else {
            return;
        };
        loop {
            let until = held.hold_until().max(lease.valid_until());
            tokio::select! {
                () = held.done.cancelled() => return,
                () = tokio::time::sleep_until(until) => {}
            }
            {
                let mut phase = held.phase();
                if *phase == Phase::Gone {
                    return;
                }
                if *phase == Phase::Held && Instant::now() < held.hold_until() {
                    continue; // extended meanwhile
                }
                *phase = Phase::Expired;
            }
            break;
        }
        held.forget();
        while !held.session.is_terminal() {
            match held.delete().await {
                Ok(_) => break,
                Err(error) => {
                    tracing::debug!(path = held.path, %error, "expiry: deleting the lock node failed; retrying");
                    tokio::select! {
                        () = held.done.cancelled() => return,
                        () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                    }
                }
            }
        }
        *held.phase() = Phase::Gone;
    });
}
