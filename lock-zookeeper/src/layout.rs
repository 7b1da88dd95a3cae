//! [`Layout`]: the znode names and queue order a store uses, chosen by the URL option
//! `layout`. A leaf: the config parses it, the names in `keys` follow it.

/// Which znode names and queue order a store uses (URL option `layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Layout {
    /// `layout=fencelock` (the default): lock nodes `{owner id}-lock-{sequence}` in a container
    /// node per key, queued as Curator queues them, and clock-floored tokens (the prefix's
    /// token offset plus the node's `czxid`, see the crate docs, *Tokens across a swap*).
    #[default]
    Fencelock,
    /// `layout=curator`: exactly Apache Curator `InterProcessMutex`'s names and order
    /// (`_c_{uuid}-lock-{sequence}` under the lock path, a container node, every child sorted
    /// by the text after its last `lock-`), so Curator clients on the same path exclude
    /// fencelock's and the other way round. The token is the raw `czxid`.
    Curator,
    /// `layout=kazoo`: exactly kazoo `Lock`'s names and order (`{uuid hex}__lock__{sequence}`
    /// under a persistent lock path; only `__lock__` and `__rlock__` nodes are contenders,
    /// sorted by their sequence), so kazoo clients on the same path exclude fencelock's and the
    /// other way round. The token is the raw `czxid`.
    Kazoo,
}

impl Layout {
    /// The option's value: `fencelock`, `curator` or `kazoo`.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Fencelock => "fencelock",
            Layout::Curator => "curator",
            Layout::Kazoo => "kazoo",
        }
    }

    /// The layout an option's value names (`None`: no layout is called that).
    pub(crate) fn parse(value: &str) -> Option<Self> {
        [Layout::Fencelock, Layout::Curator, Layout::Kazoo]
            .into_iter()
            .find(|layout| layout.as_str() == value)
    }
}
