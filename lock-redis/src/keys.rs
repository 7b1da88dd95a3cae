//! The Redis names of a lock key: the lock, its fencing counter, its shared holders, its
//! waiting writers, its holders' labels and its release channel, all under one Cluster hash
//! tag (in [`Layout::Plain`], the lock is the key itself).

use fencelock_core::OwnerId;

use crate::config::Layout;

/// The Redis names of one lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyNames {
    /// `{prefix}{{key}}:lock`, holding the owner id with a PX expiry; while the key is held in
    /// shared or permit mode, the mode's tag (`fencelock:shared`, `fencelock:permits:L`)
    /// expiring with the last holder.
    pub(crate) lock: String,
    /// `{prefix}{{key}}:fence`, the last token minted; expires one retention window after the
    /// last acquire.
    pub(crate) fence: String,
    /// `{prefix}{{key}}:holders`, a sorted set of the shared or permit holders
    /// (`owner:token:slot`, scored by their expiry in server µs); expires with the last one.
    pub(crate) holders: String,
    /// `{prefix}{{key}}:writers`, a sorted set of the exclusive requests waiting for the key
    /// (a random waiter id, scored by the expiry of its mark in server µs), which keep new
    /// shared requests out; expires with the last mark.
    pub(crate) writers: String,
    /// `{prefix}{{key}}:label:`, followed by a holder's owner id: that holder's label (only
    /// for a holder that has one), expiring with the holder. Named by the owner, which is fresh
    /// for every grant, so a label never outlives its holder's name: one left over could only
    /// be read for an owner that no longer holds anything.
    pub(crate) labels: String,
    /// `{prefix}{{key}}:released`, the pub/sub channel a release publishes on.
    pub(crate) channel: String,
}

// The suffix of each name after the key's hash tag, written once.
const LOCK: &str = ":lock";
const FENCE: &str = ":fence";
const HOLDERS: &str = ":holders";
const WRITERS: &str = ":writers";
const LABELS: &str = ":label:";
const CHANNEL: &str = ":released";

/// The `SCAN MATCH` pattern of the names a listing reads for the keys that start with
/// `key_prefix`, and how to read a key back from one: in [`Layout::Fencelock`] each held key's
/// `:lock` (it exists exactly while the key is held, in any mode); in [`Layout::Plain`], whose
/// lock is the bare key, its `:fence` (kept a retention window after the last acquire).
pub(crate) struct Listed {
    prefix: String,
    suffix: &'static str,
}

impl Listed {
    pub(crate) fn new(layout: Layout, prefix: &str) -> Self {
        let suffix = match layout {
            Layout::Fencelock => LOCK,
            Layout::Plain => FENCE,
        };
        Listed {
            prefix: prefix.to_owned(),
            suffix,
        }
    }

    /// `{prefix}{{escaped key_prefix}*}{suffix}`, `*?[]\` escaped for `MATCH`. A key's tag has
    /// no `}` (escaped), so the tag's end is the first `}`.
    pub(crate) fn pattern(&self, key_prefix: &str) -> String {
        format!(
            "{}{{{}*}}{}",
            glob_escape(&self.prefix),
            glob_escape(&hash_tag(key_prefix)),
            self.suffix
        )
    }

    /// The key whose listed name `name` is, if it is one.
    pub(crate) fn key_of(&self, name: &str) -> Option<String> {
        let tag = name
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix(self.suffix)?
            .strip_suffix('}')?;
        // Only `%` and `}` are escaped, so the tag decodes exactly.
        fencelock_core::raw::url::percent_decode(tag)
    }
}

/// `text` as a literal `SCAN MATCH` pattern: `*`, `?`, `[`, `]` and `\` escaped.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Which of a key's names [`KeyNames::arg`] builds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Name {
    Lock,
    Fence,
    Queue,
    Channel,
}

impl KeyNames {
    /// The names in `layout`.
    pub(crate) fn in_layout(layout: Layout, prefix: &str, key: &str) -> Self {
        if let Some(names) = quick_names(layout, prefix, key) {
            return names;
        }
        match layout {
            Layout::Fencelock => Self::new(prefix, key),
            Layout::Plain => Self::plain(prefix, key),
        }
    }

    /// One of `key`'s names in `layout`, without building the others (an exclusive acquire
    /// or release uses two of the five), as an argument written into the command in place.
    pub(crate) fn arg<'a>(
        layout: Layout,
        prefix: &'a str,
        key: &'a str,
        which: Name,
    ) -> NameArg<'a> {
        if needs_escaping(key) {
            let names = Self::in_layout(layout, prefix, key);
            return NameArg::Whole(
                match which {
                    Name::Lock => names.lock,
                    Name::Fence => names.fence,
                    Name::Queue => names.writers,
                    Name::Channel => names.channel,
                }
                .into(),
            );
        }
        let in_tag = |suffix| NameArg::Tagged {
            prefix,
            key,
            suffix,
        };
        match (which, layout) {
            (Name::Lock, Layout::Plain) => NameArg::Whole(key.into()),
            (Name::Lock, _) => in_tag(LOCK),
            (Name::Fence, _) => in_tag(FENCE),
            (Name::Queue, _) => in_tag(WRITERS),
            (Name::Channel, _) => in_tag(CHANNEL),
        }
    }

    /// [`Layout::Plain`]: the lock is the key itself, as `SET key value NX PX` clients name it;
    /// the fence, the holders, the writers and the channel keep fencelock's names, shared with [`Layout::Fencelock`], so
    /// tokens keep growing when a key's clients switch layouts.
    pub(crate) fn plain(prefix: &str, key: &str) -> Self {
        KeyNames {
            lock: key.to_owned(),
            ..Self::new(prefix, key)
        }
    }

    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let tag = hash_tag(key);
        let name = |suffix| tagged_parts(prefix, &tag, suffix).concat();
        KeyNames {
            lock: name(LOCK),
            fence: name(FENCE),
            holders: name(HOLDERS),
            writers: name(WRITERS),
            labels: name(LABELS),
            channel: name(CHANNEL),
        }
    }

    /// The key of the label of the holder `owner`.
    pub(crate) fn label(&self, owner: OwnerId) -> String {
        format!("{}{owner}", self.labels)
    }
}

/// One of a key's names as a command argument, written into the command in place: no `String`
/// of its own for the usual key (an exclusive acquire and release name two keys each, and the
/// four allocations were about 2% of a cycle's client instructions, callgrind).
#[derive(Debug, Clone)]
pub(crate) enum NameArg<'a> {
    /// `{prefix}{{key}}{suffix}`, for a key that needs no escaping.
    Tagged {
        prefix: &'a str,
        key: &'a str,
        suffix: &'static str,
    },
    /// A name as it is: the plain layout's lock (the key itself), or an escaped key's name.
    Whole(std::borrow::Cow<'a, str>),
}

/// `{prefix}{{key}}{suffix}` in its five pieces: the one place a tagged name's form is written.
fn tagged_parts<'a>(prefix: &'a str, key: &'a str, suffix: &'a str) -> [&'a str; 5] {
    [prefix, "{", key, "}", suffix]
}

impl NameArg<'_> {
    /// The name's length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            NameArg::Tagged {
                prefix,
                key,
                suffix,
            } => tagged_parts(prefix, key, suffix)
                .iter()
                .map(|p| p.len())
                .sum(),
            NameArg::Whole(name) => name.len(),
        }
    }

    /// The name as a `String` of its own (one allocation of the exact size).
    pub(crate) fn into_string(self) -> String {
        match self {
            NameArg::Tagged {
                prefix,
                key,
                suffix,
            } => tagged_parts(prefix, key, suffix).concat(),
            NameArg::Whole(name) => name.into_owned(),
        }
    }
}

impl std::fmt::Display for NameArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameArg::Tagged {
                prefix,
                key,
                suffix,
            } => tagged_parts(prefix, key, suffix)
                .iter()
                .try_for_each(|part| f.write_str(part)),
            NameArg::Whole(name) => f.write_str(name),
        }
    }
}

impl redis::ToRedisArgs for NameArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            NameArg::Tagged {
                prefix,
                key,
                suffix,
            } => {
                let parts = tagged_parts(prefix, key, suffix);
                // Assembled on the stack when it fits (the redis crate's writer for an
                // argument in place costs more per part than the allocation it saves).
                let mut buf = [0u8; 192];
                let len = self.len();
                if len > buf.len() {
                    out.write_arg(parts.concat().as_bytes());
                    return;
                }
                let mut at = 0;
                for part in parts {
                    buf[at..at + part.len()].copy_from_slice(part.as_bytes());
                    at += part.len();
                }
                out.write_arg(&buf[..len]);
            }
            NameArg::Whole(name) => out.write_arg(name.as_bytes()),
        }
    }
}

/// [`KeyNames::in_layout`] for a key that needs no escaping in its hash tag (no `%` or `}`,
/// so the tag is the key as it is): the same names, built by copying instead of `format!`,
/// which cost about a fifth of the client's work in a lock cycle. `None` for other keys.
fn quick_names(layout: Layout, prefix: &str, key: &str) -> Option<KeyNames> {
    if needs_escaping(key) {
        return None;
    }
    let name = |suffix| {
        NameArg::Tagged {
            prefix,
            key,
            suffix,
        }
        .into_string()
    };
    Some(KeyNames {
        lock: match layout {
            Layout::Fencelock => name(LOCK),
            Layout::Plain => key.to_owned(),
        },
        fence: name(FENCE),
        holders: name(HOLDERS),
        writers: name(WRITERS),
        labels: name(LABELS),
        channel: name(CHANNEL),
    })
}

/// Whether `key` is escaped in its hash tag ([`hash_tag`]).
fn needs_escaping(key: &str) -> bool {
    key.contains(['%', '}'])
}

/// The key as a Cluster hash tag: `%` and `}` escaped (`%25`, `%7D`), so the tag is the whole
/// key, never empty, and two keys never share names. Other keys are written as they are.
fn hash_tag(key: &str) -> std::borrow::Cow<'_, str> {
    if !needs_escaping(key) {
        return key.into();
    }
    key.replace('%', "%25").replace('}', "%7D").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_names_are_the_key_names() {
        for layout in [Layout::Fencelock, Layout::Plain] {
            for key in ["jobs/nightly", "a", "{x", "x{y", "ünïcode key", "a:b:c"] {
                for prefix in ["fencelock:", "", "p/q:"] {
                    let slow = match layout {
                        Layout::Fencelock => KeyNames::new(prefix, key),
                        Layout::Plain => KeyNames::plain(prefix, key),
                    };
                    assert_eq!(
                        quick_names(layout, prefix, key),
                        Some(slow),
                        "{layout:?} {prefix:?} {key:?}"
                    );
                }
            }
            for key in ["a}b", "100%", "}", "%7D"] {
                assert_eq!(quick_names(layout, "p:", key), None, "{key:?}");
            }
        }
    }

    #[test]
    fn key_names_share_a_hash_tag() {
        let names = KeyNames::new("fencelock:", "jobs/nightly");
        assert_eq!(names.lock, "fencelock:{jobs/nightly}:lock");
        assert_eq!(names.fence, "fencelock:{jobs/nightly}:fence");
        assert_eq!(names.channel, "fencelock:{jobs/nightly}:released");
        assert_eq!(names.holders, "fencelock:{jobs/nightly}:holders");
        assert_eq!(names.writers, "fencelock:{jobs/nightly}:writers");
        assert_eq!(names.labels, "fencelock:{jobs/nightly}:label:");
        let owner = OwnerId::random();
        assert_eq!(
            names.label(owner),
            format!("fencelock:{{jobs/nightly}}:label:{owner}")
        );
        // Braces and percent signs: the tag (first `{` to the first `}` after it) is the whole
        // escaped key, the same in all three names, never empty, and distinct keys stay apart.
        let tag = |name: &str| {
            let open = name.find('{').unwrap();
            let close = open + name[open..].find('}').unwrap();
            name[open + 1..close].to_owned()
        };
        for key in ["a}b{c", "}leading", "%7D", "}", "100%", "{x}"] {
            let names = KeyNames::new("p:", key);
            assert!(!tag(&names.lock).is_empty(), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.fence), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.channel), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.holders), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.writers), "{key:?}");
            assert_eq!(tag(&names.lock), tag(&names.labels), "{key:?}");
        }
        assert_ne!(KeyNames::new("p:", "}"), KeyNames::new("p:", "%7D"));
        assert_eq!(KeyNames::new("p:", "}x").lock, "p:{%7Dx}:lock");
    }

    #[test]
    fn a_name_argument_is_its_name_however_long() {
        use redis::ToRedisArgs;
        for key in ["jobs/nightly", "", &"k".repeat(180), &"k".repeat(2000)] {
            let arg = NameArg::Tagged {
                prefix: "fencelock:",
                key,
                suffix: ":fence",
            };
            let name = KeyNames::new("fencelock:", key).fence;
            assert_eq!(arg.to_string(), name);
            assert_eq!(arg.len(), name.len());
            assert_eq!(
                arg.to_redis_args(),
                vec![name.into_bytes()],
                "{} bytes",
                key.len()
            );
        }
        let whole = NameArg::Whole("p:{%7D}:lock".into());
        assert_eq!(whole.to_redis_args(), vec![b"p:{%7D}:lock".to_vec()]);
    }

    #[test]
    fn the_plain_layout_locks_the_key_itself_and_keeps_the_fence() {
        let plain = KeyNames::in_layout(Layout::Plain, "fencelock:", "jobs/nightly");
        let ours = KeyNames::in_layout(Layout::Fencelock, "fencelock:", "jobs/nightly");
        assert_eq!(plain.lock, "jobs/nightly");
        assert_eq!(plain.fence, ours.fence);
        assert_eq!(plain.channel, ours.channel);
        assert_eq!(plain.holders, ours.holders);
        assert_eq!(plain.writers, ours.writers);
        assert_eq!(plain.labels, ours.labels);
        assert_eq!(ours, KeyNames::new("fencelock:", "jobs/nightly"));
    }
}
