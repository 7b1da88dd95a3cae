//! The check that the server cannot evict a held lock: a lock key carries a TTL, so with
//! `maxmemory` set and any policy but `noeviction` (managed Redis often defaults to
//! `volatile-lru`), memory pressure can delete it while its holder still counts on it, and the
//! next holder gets the key before the first one's local deadline.

use std::fmt;

use fencelock_core::{Error, Result};
use redis::aio::ConnectionLike;
use redis::RedisError;

use crate::error::{is_unavailable, redis_error};

/// The policy under which Redis never evicts: a full server refuses writes (`OOM`, which the
/// store treats as retryable) and keeps every key it has.
const NO_EVICTION: &str = "noeviction";

/// The two settings that decide whether Redis may evict keys, as the server reported them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionSettings {
    maxmemory: u64,
    policy: String,
    read_with: &'static str,
}

impl EvictionSettings {
    /// `maxmemory` in bytes; 0 means no limit, so nothing is ever evicted.
    pub fn maxmemory(&self) -> u64 {
        self.maxmemory
    }

    /// `maxmemory-policy`, such as `noeviction` or `volatile-lru`.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// How they were read: `"CONFIG GET"`, or `"INFO memory"` where `CONFIG` is not allowed.
    pub fn read_with(&self) -> &'static str {
        self.read_with
    }

    /// True if the server may evict keys: a memory limit and a policy other than `noeviction`.
    pub fn can_evict(&self) -> bool {
        self.maxmemory > 0 && self.policy != NO_EVICTION
    }
}

impl fmt::Display for EvictionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maxmemory {} and maxmemory-policy {} (read with {})",
            self.maxmemory, self.policy, self.read_with
        )
    }
}

/// What a store handle found out about one server's eviction settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// The server cannot evict a lock: no memory limit, or the policy is `noeviction`.
    CannotEvict(EvictionSettings),
    /// Not checked: the URL says `allow_eviction=true`, so the risk was accepted knowingly.
    Allowed,
    /// Neither `CONFIG GET` nor `INFO memory` told (renamed or disabled commands, an ACL user
    /// without them): the store went on, and said so once through `tracing` at warn level.
    Unknown {
        /// Each command's failure, without secrets.
        reason: String,
    },
}

impl fmt::Display for EvictionCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictionCheck::CannotEvict(settings) => write!(f, "cannot evict locks: {settings}"),
            EvictionCheck::Allowed => f.write_str("eviction not checked (allow_eviction=true)"),
            EvictionCheck::Unknown { reason } => write!(
                f,
                "eviction settings unknown, a held lock may be evicted without notice ({reason})"
            ),
        }
    }
}

/// The notes an operator should see about eviction checks (a node's label, its check): one
/// per node whose check could not tell or has not answered yet, what the Redis stores'
/// [`LockStore::diagnostics`](fencelock_core::LockStore::diagnostics) says.
pub(crate) fn notes<'a>(
    checks: impl IntoIterator<Item = (&'a str, Option<&'a EvictionCheck>)>,
) -> Vec<String> {
    checks
        .into_iter()
        .filter_map(|(node, check)| match check {
            Some(unknown @ EvictionCheck::Unknown { .. }) => Some(format!("{node}: {unknown}")),
            None => Some(format!(
                "{node}: eviction settings not checked yet (no answer so far)"
            )),
            Some(_) => None,
        })
        .collect()
}

/// Why a store refused a server: it may evict held locks. The `source` of the
/// [`Error::Store`] that `connect` (or a lazy handle's first use) returns; reach it with
/// `std::error::Error::source` and `downcast_ref::<EvictionRisk>()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRisk {
    node: String,
    settings: EvictionSettings,
}

impl EvictionRisk {
    /// The server, as its URL without the password.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// What the server reported.
    pub fn settings(&self) -> &EvictionSettings {
        &self.settings
    }
}

impl fmt::Display for EvictionRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: Redis may evict a held lock: {}, so under memory pressure it can delete a \
             lock key (it has a TTL) while its holder still counts on it, and the next holder \
             gets the key. Set maxmemory-policy to noeviction (or maxmemory to 0), or accept \
             the risk knowingly with the URL option allow_eviction=true",
            self.node, self.settings
        )
    }
}

impl std::error::Error for EvictionRisk {}

/// The risk behind `error`, if it is an eviction refusal.
pub(crate) fn risk_of(error: &Error) -> Option<&EvictionRisk> {
    std::error::Error::source(error)?.downcast_ref()
}

/// Reads the eviction settings of the server behind `conn` (named `node` in messages) and
/// refuses it if it may evict.
///
/// Tries `CONFIG GET maxmemory*` (one pattern, so Redis 5 and 6 answer too), then
/// `INFO memory` if `CONFIG` is refused or answers without them. Fails with the retryable
/// [`Error::Unavailable`] if the server could not be asked, and with [`Error::Store`] (source
/// [`EvictionRisk`]) if it may evict. Neither command answering is [`EvictionCheck::Unknown`].
pub(crate) async fn check<C: ConnectionLike>(conn: &mut C, node: &str) -> Result<EvictionCheck> {
    let by_config = match read_with_config(conn).await {
        Ok(Some(settings)) => return verdict(node, settings),
        Ok(None) => "CONFIG GET answered without maxmemory and maxmemory-policy".to_owned(),
        Err(e) => refused_or_unavailable("CONFIG GET", e)?,
    };
    let by_info = match read_with_info(conn).await {
        Ok(Some(settings)) => return verdict(node, settings),
        Ok(None) => "INFO memory answered without maxmemory and maxmemory_policy".to_owned(),
        Err(e) => refused_or_unavailable("INFO memory", e)?,
    };
    Ok(EvictionCheck::Unknown {
        reason: format!("{by_config}; {by_info}"),
    })
}

/// A command the server refused (renamed, disabled, not in the ACL) is a reason to try the
/// next one; a server that could not be asked ends the check.
fn refused_or_unavailable(command: &str, error: RedisError) -> Result<String> {
    if is_unavailable(&error) {
        return Err(redis_error(&format!("eviction check: {command}"), error));
    }
    Ok(format!("{command}: {error}"))
}

fn verdict(node: &str, settings: EvictionSettings) -> Result<EvictionCheck> {
    if !settings.can_evict() {
        return Ok(EvictionCheck::CannotEvict(settings));
    }
    let risk = EvictionRisk {
        node: node.to_owned(),
        settings,
    };
    Err(Error::Store {
        message: risk.to_string(),
        source: Some(Box::new(risk)),
    })
}

async fn read_with_config<C: ConnectionLike>(
    conn: &mut C,
) -> std::result::Result<Option<EvictionSettings>, RedisError> {
    // A flat name/value list in RESP2, a map in RESP3: the redis crate reads both as pairs.
    let pairs: Vec<(String, String)> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory*")
        .query_async(conn)
        .await?;
    let value = |name: &str| {
        pairs
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    };
    Ok(settings(
        value("maxmemory"),
        value("maxmemory-policy"),
        "CONFIG GET",
    ))
}

async fn read_with_info<C: ConnectionLike>(
    conn: &mut C,
) -> std::result::Result<Option<EvictionSettings>, RedisError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    Ok(parse_info(&info))
}

/// `maxmemory:N` and `maxmemory_policy:NAME` lines of an `INFO memory` answer.
fn parse_info(info: &str) -> Option<EvictionSettings> {
    let value = |name: &str| {
        info.lines()
            .filter_map(|line| line.trim_end().split_once(':'))
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value)
    };
    settings(value("maxmemory"), value("maxmemory_policy"), "INFO memory")
}

fn settings(
    maxmemory: Option<&str>,
    policy: Option<&str>,
    read_with: &'static str,
) -> Option<EvictionSettings> {
    Some(EvictionSettings {
        maxmemory: maxmemory?.trim().parse().ok()?,
        policy: policy?.trim().to_ascii_lowercase(),
        read_with,
    })
    .filter(|s| !s.policy.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_memory_lines_give_both_settings() {
        let info = "# Memory\r\nused_memory:1000\r\nmaxmemory:8388608\r\nmaxmemory_human:8.00M\r\n\
                    maxmemory_policy:volatile-lru\r\n";
        let settings = parse_info(info).expect("both settings");
        assert_eq!(settings.maxmemory(), 8_388_608);
        assert_eq!(settings.policy(), "volatile-lru");
        assert_eq!(settings.read_with(), "INFO memory");
        assert!(settings.can_evict());
        assert_eq!(parse_info("# Memory\r\nmaxmemory:0\r\n"), None);
        assert_eq!(
            parse_info("maxmemory:lots\r\nmaxmemory_policy:noeviction\r\n"),
            None
        );
    }

    #[test]
    fn only_a_limit_with_an_evicting_policy_can_evict() {
        let can_evict = |maxmemory, policy| {
            settings(Some(maxmemory), Some(policy), "CONFIG GET")
                .expect("settings")
                .can_evict()
        };
        assert!(can_evict("8388608", "volatile-lru"));
        assert!(can_evict("1", "allkeys-random"));
        assert!(can_evict("1", "VOLATILE-TTL"));
        assert!(!can_evict("0", "volatile-lru"), "no limit, nothing evicted");
        assert!(!can_evict("8388608", "noeviction"));
    }

    #[test]
    fn the_refusal_names_the_settings_and_the_way_out() {
        let settings = settings(Some("8388608"), Some("volatile-lru"), "INFO memory");
        let error = verdict("redis://127.0.0.1:7000", settings.expect("settings"))
            .expect_err("an evicting server is refused");
        assert!(!error.is_retryable());
        let message = error.to_string();
        for part in [
            "redis://127.0.0.1:7000",
            "maxmemory 8388608",
            "maxmemory-policy volatile-lru",
            "INFO memory",
            "noeviction",
            "allow_eviction=true",
        ] {
            assert!(message.contains(part), "{part:?} missing: {message}");
        }
        let source = std::error::Error::source(&error).expect("a source");
        let risk = source.downcast_ref::<EvictionRisk>().expect("EvictionRisk");
        assert_eq!(risk.settings().policy(), "volatile-lru");
    }
}
