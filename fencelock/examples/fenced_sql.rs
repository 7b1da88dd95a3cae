//! A fenced SQL write: the lease's fencing token is kept in the row the lock guards, and the
//! write goes through only while no greater token has claimed the row, so a holder that paused
//! past its TTL cannot overwrite the next holder's work.
//!
//! ```sh
//! DATABASE_URL=postgres://app@127.0.0.1/app cargo run -p fencelock --features postgres,fence-postgres --example fenced_sql
//! DATABASE_URL=postgres://app@127.0.0.1/app LOCK_URL=redis://127.0.0.1:6379 \
//!   cargo run -p fencelock --features postgres,redis,fence-postgres --example fenced_sql
//! ```
//!
//! The lock may live in any store (`LOCK_URL`, the database itself by default); the fence is
//! the row's `fence` column.

use std::time::Duration;

use fencelock::fence::{FencedTable, TableNames};
use fencelock::LockStoreExt;
use sqlx::Connection;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database = std::env::var("DATABASE_URL")?;
    let lock_url = std::env::var("LOCK_URL").unwrap_or_else(|_| database.clone());
    let store = fencelock::connect(&lock_url).await?;
    let mut db = sqlx::PgConnection::connect(&database).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS balances \
         (account bigint PRIMARY KEY, fence bigint NOT NULL, balance bigint NOT NULL)",
    )
    .execute(&mut db)
    .await?;
    let balances = FencedTable::new(&TableNames {
        schema: None,
        table: "balances",
        key: "account",
        fence: "fence",
        values: &["balance"],
    })?;

    let account = 42_i64;
    let guard = store
        .lock(&format!("balances:{account}"))
        .wait(Duration::from_secs(10))
        .await?;
    let token = guard.fencing_token();
    // Claim the row as we read it: from now on every lower token is refused.
    let balance = match balances.claim::<_, (i64,)>(&mut db, account, token).await? {
        Some((balance,)) => balance,
        None => 0,
    };
    // A refused write is an error of kind LeaseLost: a newer holder has the row.
    balances
        .upsert(account, token)?
        .bind(balance + 100)
        .execute(&mut db)
        .await?;
    println!(
        "account {account}: {balance} → {} under token {token}",
        balance + 100
    );
    println!("release: {:?}", guard.release().await?);
    Ok(())
}
