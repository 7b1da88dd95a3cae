//! URL → store: which scheme names which store, and whether this build includes it.

use std::fmt;

use url::Url;

pub use lock_core::url::redact;

use crate::{Error, Result};

/// The stores a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `memory://[name]`: the in-process store; one per name within the process.
    Memory,
    /// `redis://` and `rediss://` (TLS): a single Redis server.
    Redis,
    /// `redlock://h:p,h:p,h:p`: Redlock over independent Redis masters.
    Redlock,
    /// `etcd://h:p[,h:p…]` and `etcds://` (TLS).
    Etcd,
    /// `postgres://` and `postgresql://`.
    Postgres,
}

/// Every scheme spelling `connect` understands, for error messages.
pub const KNOWN_SCHEMES: &[&str] = &[
    "memory",
    "redis",
    "rediss",
    "redlock",
    "etcd",
    "etcds",
    "postgres",
    "postgresql",
];

impl Scheme {
    /// The scheme of `url`, or an error naming the known schemes.
    pub fn of(url: &str) -> Result<Self> {
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(Error::invalid(
                "url",
                format!(
                    "{} has no scheme; expected one of {}",
                    redact(url),
                    KNOWN_SCHEMES.join(", ")
                ),
            ));
        };
        Ok(match scheme.to_ascii_lowercase().as_str() {
            "memory" => Scheme::Memory,
            "redis" | "rediss" => Scheme::Redis,
            "redlock" => Scheme::Redlock,
            "etcd" | "etcds" => Scheme::Etcd,
            "postgres" | "postgresql" => Scheme::Postgres,
            other => {
                return Err(Error::invalid(
                    "url",
                    format!(
                        "unknown scheme {other:?}; known schemes: {}",
                        KNOWN_SCHEMES.join(", ")
                    ),
                ))
            }
        })
    }

    /// The cargo feature of `fencelock` that compiles this store in, if it needs one.
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Scheme::Memory => None,
            Scheme::Redis | Scheme::Redlock => Some("redis"),
            Scheme::Etcd => Some("etcd"),
            Scheme::Postgres => Some("postgres"),
        }
    }

    /// Whether this build includes the store.
    pub fn is_enabled(self) -> bool {
        match self {
            Scheme::Memory => true,
            Scheme::Redis | Scheme::Redlock => cfg!(feature = "redis"),
            Scheme::Etcd => cfg!(feature = "etcd"),
            Scheme::Postgres => cfg!(feature = "postgres"),
        }
    }

    /// An error saying which feature to enable for this scheme.
    pub(crate) fn not_enabled(self) -> Error {
        let feature = self.feature().unwrap_or("default");
        Error::invalid(
            "url",
            format!(
                "the {self} store is not compiled in: enable fencelock's `{feature}` feature \
                 (or `full`)"
            ),
        )
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Memory => "memory",
            Scheme::Redis => "redis",
            Scheme::Redlock => "redlock",
            Scheme::Etcd => "etcd",
            Scheme::Postgres => "postgres",
        })
    }
}

/// Parses a single-host URL, for stores that take one.
#[allow(dead_code)]
pub(crate) fn parse_url(url: &str) -> Result<Url> {
    Url::parse(url).map_err(|e| Error::invalid("url", format!("{}: {e}", redact(url))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_parse_from_urls() {
        let table: &[(&str, Option<Scheme>)] = &[
            ("memory://", Some(Scheme::Memory)),
            ("memory://shared", Some(Scheme::Memory)),
            ("redis://127.0.0.1:6379/0", Some(Scheme::Redis)),
            ("rediss://user:pw@example.com:6380", Some(Scheme::Redis)),
            ("REDIS://127.0.0.1", Some(Scheme::Redis)),
            ("redlock://a:1,b:2,c:3", Some(Scheme::Redlock)),
            ("etcd://a:2379,b:2379", Some(Scheme::Etcd)),
            ("etcds://a:2379", Some(Scheme::Etcd)),
            (
                "postgres://u:p@h/db?sslmode=require",
                Some(Scheme::Postgres),
            ),
            ("postgresql://h/db", Some(Scheme::Postgres)),
            ("mysql://h/db", None),
            ("consul://h", None),
            ("127.0.0.1:6379", None),
            ("", None),
        ];
        for (url, expected) in table {
            match (Scheme::of(url), expected) {
                (Ok(scheme), Some(expected)) => assert_eq!(scheme, *expected, "{url}"),
                (Err(Error::InvalidInput { what, rule }), None) => {
                    assert_eq!(what, "url");
                    assert!(rule.contains("redis, rediss"), "{url}: {rule}");
                }
                (other, _) => panic!("{url}: {other:?}"),
            }
        }
    }
}
