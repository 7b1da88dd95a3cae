//! Hostile input: every URL parser and `connect` survive any text without a panic
//! and never print a password, wherever it sits in the URL and however it is encoded; keys of
//! any valid UTF-8 within the limits round-trip through `status`, and invalid ones are refused
//! as `InvalidInput`.
#![cfg(all(feature = "redis", feature = "etcd", feature = "postgres"))]

use std::time::Duration;

use fencelock::fencelock_etcd::EtcdConfig;
use fencelock::fencelock_postgres::PostgresConfig;
use fencelock::fencelock_redis::{RedisConfig, RedlockConfig};
use fencelock::limits::MAX_KEY_LEN;
use fencelock::{connect, redact, DynLockStore, Error, KeyStatus, ReleaseOutcome};
use proptest::prelude::*;

/// The schemes every parser below is fed, so hostile text often reaches past the scheme check.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redlock",
    "etcd",
    "etcds",
    "postgres",
    "postgresql",
    "memory",
];

/// A password that cannot occur in a message by chance: a fixed marker, then any characters,
/// the URL's delimiters and non-ASCII ones included.
fn password() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!$&'()*+,;=:@/?#%~ é✓-]{4,16}".prop_map(|tail| format!("Zq7x{tail}"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters, as a careful user would.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A URL carrying `secret` somewhere a password goes: the userinfo (encoded, half-encoded or
/// raw), a `password=` option, next to other options, on several hosts.
fn url_with_password(scheme: &'static str, secret: &str, position: usize, junk: &str) -> String {
    let encoded = encode(secret);
    // Only the characters that end an authority encoded: what a hurried user writes.
    let half = secret
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('?', "%3F")
        .replace('#', "%23")
        .replace('@', "%40");
    let hosts = match scheme {
        "redlock" => "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        "etcd" | "etcds" => "127.0.0.1:1,127.0.0.1:2",
        _ => "127.0.0.1:1",
    };
    let path = if scheme.starts_with("postgres") {
        "/db"
    } else {
        "/0"
    };
    match position % 7 {
        0 => format!("{scheme}://user:{encoded}@{hosts}{path}"),
        1 => format!("{scheme}://:{encoded}@{hosts}{path}?connect_timeout=100ms"),
        2 => format!("{scheme}://user:{half}@{hosts}{path}?{junk}"),
        3 => format!("{scheme}://user:{secret}@{hosts}{path}"),
        4 => format!("{scheme}://{hosts}{path}?password={encoded}&connect_timeout=100ms"),
        5 => format!("{scheme}://{hosts}{path}?{junk}&password={encoded}"),
        _ => format!("{scheme}://u:{encoded}@{hosts}{path}?prefix=p&{junk}#{junk}"),
    }
}

/// Fails the case if `text` shows the password in any form it was written in.
fn assert_hidden(text: &str, secret: &str, url: &str) -> Result<(), TestCaseError> {
    for form in [secret.to_owned(), encode(secret)] {
        prop_assert!(
            !text.contains(&form),
            "the password {form:?} of {url:?} shows in {text:?}"
        );
    }
    Ok(())
}

/// Every rendering of a parser's answer: `Display` and `Debug` of the config, or of the error.
fn renderings<T: std::fmt::Display + std::fmt::Debug>(
    parsed: &fencelock::Result<T>,
) -> [String; 2] {
    match parsed {
        Ok(config) => [config.to_string(), format!("{config:?}")],
        Err(error) => [error.to_string(), format!("{error:?}")],
    }
}

/// Runs every store's URL parser on `url` and returns what each printed.
fn parse_everywhere(url: &str) -> Vec<String> {
    let mut texts = Vec::new();
    texts.extend(renderings(&RedisConfig::from_url(url)));
    texts.extend(renderings(&RedlockConfig::from_url(url)));
    texts.extend(renderings(&EtcdConfig::from_url(url)));
    texts.extend(renderings(&PostgresConfig::from_url(url)));
    texts.push(redact(url));
    texts
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn url_parsers_never_panic_on_any_text(text in "\\PC{0,60}") {
        let _ = parse_everywhere(&text);
    }

    #[test]
    fn url_parsers_never_panic_on_url_shaped_text(
        scheme in proptest::sample::select(SCHEMES),
        rest in "[a-z0-9:@/?#&=%\\[\\].,_-]{0,40}|\\PC{0,40}",
    ) {
        let _ = parse_everywhere(&format!("{scheme}://{rest}"));
    }

    #[test]
    fn parsers_never_print_a_password(
        scheme in proptest::sample::select(SCHEMES),
        secret in password(),
        position in 0usize..7,
        junk in "[a-z_]{0,8}=[a-z0-9%@]{0,8}",
    ) {
        let url = url_with_password(scheme, &secret, position, &junk);
        for text in parse_everywhere(&url) {
            assert_hidden(&text, &secret, &url)?;
        }
    }
}

proptest! {
    // Each case may open a socket to a closed port: fewer cases, still every position.
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn connect_never_panics_and_never_prints_a_password(
        scheme in proptest::sample::select(SCHEMES),
        secret in password(),
        position in 0usize..7,
        junk in "[a-z_]{0,8}=[a-z0-9%@]{0,8}",
    ) {
        let url = url_with_password(scheme, &secret, position, &junk);
        // 127.0.0.1:1 refuses at once; the bound only keeps a stray DNS lookup from stalling.
        let answer = runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(10), connect(&url)).await
        });
        if let Ok(Err(error)) = answer {
            assert_hidden(&error.to_string(), &secret, &url)?;
            assert_hidden(&format!("{error:?}"), &secret, &url)?;
        }
    }

    #[test]
    fn connect_never_panics_on_any_text(text in "\\PC{0,40}") {
        // sqlite:// would create a file wherever the text points; it has its own bad-input
        // tests (lock-sqlite/tests/bad_input.rs).
        prop_assume!(!text.to_ascii_lowercase().contains("sqlite"));
        let _ = runtime().block_on(async {
            tokio::time::timeout(Duration::from_secs(10), connect(&text)).await
        });
    }
}

/// A key of 1 to `MAX_KEY_LEN` bytes of any UTF-8 (control characters, quotes, braces and
/// Lua/SQL syntax included).
fn valid_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{1,40}",
        "[\\x00-\\x7f]{1,40}",
        "[{}:'\"%;\\\\*?\\[\\] -]{1,20}",
        (1usize..=MAX_KEY_LEN / 4).prop_map(|n| "✓".repeat(n)),
        Just("k".repeat(MAX_KEY_LEN)),
    ]
    .prop_filter("within the limit", |k| {
        !k.is_empty() && k.len() <= MAX_KEY_LEN
    })
}

/// A key every store must refuse: empty, or one byte over the limit in any characters.
fn invalid_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "\\PC{1,8}".prop_map(|tail| {
            let mut key = "é".repeat(MAX_KEY_LEN / 2);
            key.push_str(&tail);
            key
        }),
    ]
}

/// Acquire, see the lease in `status`, release, see the key free.
async fn round_trip(store: &DynLockStore, key: &str) -> Result<(), TestCaseError> {
    let lease = store
        .try_acquire(key, Duration::from_secs(30))
        .await
        .map_err(|e| TestCaseError::fail(format!("acquire {key:?}: {e}")))?;
    match store.status(key).await {
        Ok(KeyStatus::Held { owner, token, .. }) => {
            prop_assert_eq!(owner, Some(lease.owner()));
            prop_assert_eq!(token, Some(lease.fencing_token()));
        }
        other => prop_assert!(false, "status of held {key:?}: {other:?}"),
    }
    let released = store
        .release(&lease)
        .await
        .map_err(|e| TestCaseError::fail(format!("release {key:?}: {e}")))?;
    prop_assert_eq!(released, ReleaseOutcome::Released);
    let status = store.status(key).await;
    prop_assert!(matches!(status, Ok(KeyStatus::Free)), "{key:?}: {status:?}");
    Ok(())
}

async fn refuses(store: &DynLockStore, key: &str) -> Result<(), TestCaseError> {
    let acquire = store.try_acquire(key, Duration::from_secs(30)).await;
    prop_assert!(
        matches!(acquire, Err(Error::InvalidInput { what: "key", .. })),
        "acquire {} bytes: {acquire:?}",
        key.len()
    );
    let status = store.status(key).await;
    prop_assert!(
        matches!(status, Err(Error::InvalidInput { what: "key", .. })),
        "status {} bytes: {status:?}",
        key.len()
    );
    Ok(())
}

proptest! {
    // Kept cheap: ~50 cases each, a round trip costs four commands on a real server.
    #![proptest_config(ProptestConfig { cases: 50, ..ProptestConfig::default() })]

    #[test]
    fn any_valid_key_round_trips_through_status_in_memory(key in valid_key()) {
        let rt = runtime();
        rt.block_on(async {
            let store = connect("memory://hostile-keys").await.expect("memory store");
            round_trip(&store, &key).await
        })?;
    }

    #[test]
    fn any_valid_key_round_trips_through_status_on_redis(key in valid_key()) {
        let url = format!("{}/0?prefix=hostile-keys:", test_servers::shared::redis().url());
        let rt = runtime();
        rt.block_on(async {
            let store = connect(&url).await.expect("redis store");
            round_trip(&store, &key).await
        })?;
    }

    #[test]
    fn invalid_keys_are_invalid_input_in_memory_and_on_redis(key in invalid_key()) {
        let url = format!("{}/0?prefix=hostile-keys:", test_servers::shared::redis().url());
        let rt = runtime();
        rt.block_on(async {
            for url in ["memory://hostile-keys", url.as_str()] {
                let store = connect(url).await.expect("store");
                refuses(&store, &key).await?;
            }
            Ok::<_, TestCaseError>(())
        })?;
    }
}
