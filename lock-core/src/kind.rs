//! [`StoreKind`]: what a store crate tells the facade about itself, in one value.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::raw::url::OptionDoc;
use crate::{DynLockStore, Result};

/// A boxed, sendable future borrowing for `'a`: what a [`StoreKind`]'s `connect` returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Connects to the store a URL names: a [`StoreKind`]'s entry point.
///
/// Called only with a URL whose scheme is one of the kind's [`schemes`](StoreKind::schemes).
///
/// # Cancel safety
/// Dropping the future drops any half-made connection; nothing is held yet.
pub type ConnectFn = fn(&str) -> BoxFuture<'_, Result<DynLockStore>>;

/// A store's descriptor: its name, its URL schemes, the cargo feature that compiles it into the
/// `fencelock` facade, how to connect to it, what an operator's eviction does on it, and
/// example URLs for people to copy.
///
/// Each store crate exports one per store it implements (a `descriptor.rs` with, say,
/// `pub const MINE: StoreKind`); the facade keeps one list of them and picks one by URL scheme. The
/// name is also the `store` label of every metric.
///
/// ```
/// use fencelock_core::{DynLockStore, MemoryStore, Result, StoreKind};
/// use fencelock_core::raw::BoxFuture;
///
/// fn connect(url: &str) -> BoxFuture<'_, Result<DynLockStore>> {
///     Box::pin(async move {
///         let _ = url; // parse the URL into the store's config, then connect
///         Ok(std::sync::Arc::new(MemoryStore::new()) as DynLockStore)
///     })
/// }
///
/// pub const MINE: StoreKind = StoreKind::new("mine", &["mine", "mines"], "mine", connect)
///     .with_eviction("deletes the key's row")
///     .with_example("mine://h:4000")
///     .with_tls_example("mines://h:4000?tls_ca=/etc/fencelock/ca.pem");
/// assert!(MINE.serves("MINES"));
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct StoreKind {
    /// The store's name, lower case (`redis`, `redlock`, `postgres`): in messages and as the
    /// `store` label of metrics.
    pub name: &'static str,
    /// The URL schemes it serves, lower case (`redis`, `rediss`).
    pub schemes: &'static [&'static str],
    /// The cargo feature of `fencelock` that compiles it in (empty for the memory store, which
    /// is always there).
    pub feature: &'static str,
    /// Connects to the store a URL names.
    pub connect: ConnectFn,
    /// What [`LockStore::evict`](crate::LockStore::evict) does on this store, in a few words
    /// for operators; empty when the store cannot evict.
    pub eviction: &'static str,
    /// Makes a handle of this kind that cannot reach its store, for fault tests, from a URL of
    /// this kind. `None` (the default): the store is reached over the network, and the
    /// facade's fault tools point the URL's hosts at closed ports instead.
    pub unreachable: Option<ConnectFn>,
    /// A URL of this kind for people to copy (`--help`, docs); empty when none is given.
    pub example: &'static str,
    /// A URL of this kind with TLS on, for people to copy; empty when the store has no TLS.
    pub tls_example: &'static str,
    /// The URL options its parser reads, as declared where they are parsed (a client
    /// library's own options, which the store passes on, are not listed).
    pub options: fn() -> Vec<OptionDoc>,
}

impl StoreKind {
    /// A descriptor with no eviction; add one with [`StoreKind::with_eviction`].
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        feature: &'static str,
        connect: ConnectFn,
    ) -> Self {
        StoreKind {
            name,
            schemes,
            feature,
            connect,
            eviction: "",
            unreachable: None,
            example: "",
            tls_example: "",
            options: Vec::new,
        }
    }

    /// Says what [`LockStore::evict`](crate::LockStore::evict) does on this store.
    pub const fn with_eviction(mut self, eviction: &'static str) -> Self {
        self.eviction = eviction;
        self
    }

    /// Says how to make a handle that cannot reach its store, for a store that has no host to
    /// point at a closed port (a file, say): see [`StoreKind::unreachable`].
    pub const fn with_unreachable(mut self, unreachable: ConnectFn) -> Self {
        self.unreachable = Some(unreachable);
        self
    }

    /// Gives a URL of this kind for people to copy: see [`StoreKind::example`].
    pub const fn with_example(mut self, url: &'static str) -> Self {
        self.example = url;
        self
    }

    /// Gives a URL of this kind with TLS on, for people to copy: see
    /// [`StoreKind::tls_example`].
    pub const fn with_tls_example(mut self, url: &'static str) -> Self {
        self.tls_example = url;
        self
    }

    /// Gives the URL options its parser reads: see [`StoreKind::options`].
    pub const fn with_options(mut self, options: fn() -> Vec<OptionDoc>) -> Self {
        self.options = options;
        self
    }

    /// Whether `scheme` (any case) is one of this store's.
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme))
    }
}

impl fmt::Debug for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreKind")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .field("feature", &self.feature)
            .field("eviction", &self.eviction)
            .field("unreachable", &self.unreachable.is_some())
            .field("example", &self.example)
            .field("tls_example", &self.tls_example)
            .field("options", &(self.options)().len())
            .finish_non_exhaustive()
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}
