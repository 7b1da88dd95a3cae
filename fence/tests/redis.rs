//! `FencedKey` against a real Redis started by test-servers, in the interleaving that loses
//! updates when only the write is checked: A (token 1) reads; B (token 2) takes over and
//! reads; A writes; B writes. Driven step by step, never by timing.

use fencelock_core::Error;
use fencelock_fence::FencedKey;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

async fn connect() -> MultiplexedConnection {
    let url = test_servers::shared::redis().url();
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    conn.get(key).await.expect("GET")
}

#[tokio::test]
async fn a_stale_holders_write_after_a_newer_claim_is_refused_with_stale_token() {
    let (mut a, mut b) = (connect().await, connect().await);
    let key = FencedKey::new("{interleaving}");
    assert_eq!(key.fence_key(), "{interleaving}:fence");
    let _: () = a.set(key.key(), "10").await.expect("SET");

    let a_read = key.claim(&mut a, 1).await.expect("A claims");
    let b_read = key.claim(&mut b, 2).await.expect("B claims");
    assert_eq!(a_read.as_deref(), Some(&b"10"[..]));
    assert_eq!(b_read.as_deref(), Some(&b"10"[..]));
    let refused = key.write(&mut a, 1, "11").await;
    assert!(
        matches!(
            refused,
            Err(Error::StaleToken {
                token: 1,
                highest: 2
            })
        ),
        "{refused:?}"
    );
    key.write(&mut b, 2, "12").await.expect("B writes");
    key.write(&mut b, 2, "13").await.expect("B writes again");
    assert_eq!(get(&mut a, key.key()).await.as_deref(), Some("13"));
    let late_claim = key.claim(&mut a, 1).await;
    assert!(
        matches!(
            late_claim,
            Err(Error::StaleToken {
                token: 1,
                highest: 2
            })
        ),
        "{late_claim:?}"
    );
}

#[tokio::test]
async fn a_claim_on_a_missing_value_is_recorded_and_fences_its_creation() {
    let mut conn = connect().await;
    let key = FencedKey::with_fence_key("{created}", "{created}:token");
    assert_eq!(key.claim(&mut conn, 4).await.expect("claim"), None);
    assert_eq!(
        get(&mut conn, "{created}:token").await.as_deref(),
        Some("4")
    );
    assert!(matches!(
        key.set(&mut conn, 3, "stale").await,
        Err(Error::StaleToken {
            token: 3,
            highest: 4
        })
    ));
    assert_eq!(get(&mut conn, key.key()).await, None);
    key.write(&mut conn, 4, "created").await.expect("write");
    assert_eq!(get(&mut conn, key.key()).await.as_deref(), Some("created"));
}

#[tokio::test]
async fn fenced_set_refuses_lower_tokens_and_records_the_highest() {
    let mut conn = connect().await;
    let key = FencedKey::new("{set}");
    key.set(&mut conn, 5, "five").await.expect("set");
    let refused = key.set(&mut conn, 3, "three").await;
    assert!(
        matches!(
            refused,
            Err(Error::StaleToken {
                token: 3,
                highest: 5
            })
        ),
        "{refused:?}"
    );
    key.set(&mut conn, 5, "five again")
        .await
        .expect("the holder sets again");
    key.set(&mut conn, 6, "six")
        .await
        .expect("a newer holder sets");
    assert_eq!(get(&mut conn, key.key()).await.as_deref(), Some("six"));
    assert_eq!(get(&mut conn, key.fence_key()).await.as_deref(), Some("6"));
}

#[tokio::test]
async fn a_write_without_a_claim_is_refused_as_invalid_input() {
    let mut conn = connect().await;
    let key = FencedKey::new("{unclaimed}");
    key.claim(&mut conn, 2).await.expect("claim");
    let refused = key.write(&mut conn, 9, "x").await;
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput {
                what: "fencing token",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(get(&mut conn, key.key()).await, None);
}

/// Lua numbers are doubles: 2^53 and 2^53 + 1 would compare equal. Tokens compare exactly.
#[tokio::test]
async fn tokens_beyond_double_precision_compare_exactly() {
    let mut conn = connect().await;
    let key = FencedKey::new("{precision}");
    let big = 1_u64 << 53;
    key.set(&mut conn, big + 1, "newer").await.expect("set");
    assert!(matches!(
        key.set(&mut conn, big, "older").await,
        Err(Error::StaleToken { .. })
    ));
    key.set(&mut conn, u64::MAX, "max").await.expect("set");
    assert!(matches!(
        key.claim(&mut conn, u64::MAX - 1).await,
        Err(Error::StaleToken { .. })
    ));
    assert_eq!(get(&mut conn, key.key()).await.as_deref(), Some("max"));
}

#[tokio::test]
async fn a_fence_key_that_holds_no_token_is_a_store_error() {
    let mut conn = connect().await;
    let key = FencedKey::new("{garbage}");
    let _: () = conn.set(key.fence_key(), "12abc").await.expect("SET");
    let result = key.set(&mut conn, 99, "x").await;
    assert!(matches!(result, Err(Error::Store { .. })), "{result:?}");
    assert_eq!(get(&mut conn, key.key()).await, None);
}
