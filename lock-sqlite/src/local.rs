//! Waking the waiters of this process directly: a registry of the keys this process's waiters
//! wait on, per database file, shared by every handle of the process on that file.
//!
//! A release (or an eviction) that committed bumps its key's counter here before it writes the
//! wake file (see `watch.rs`), so a waiter in the same process re-reads the key without waiting
//! for inotify to report the write. Like the watch it is a hint: the waiter still takes the key
//! through the database, and waiters in other processes still learn from the wake file.
//!
//! Handles name one file by its canonical path: the database's own if it exists, else its
//! directory's with the file name added. Two paths that resolve to the same file otherwise (a
//! hard link) share nothing here; their waiters learn from the wake file, as other processes'
//! do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use tokio::sync::watch;

/// The registry of every database file this process has handles on.
static DATABASES: LazyLock<Mutex<HashMap<PathBuf, Weak<LocalWakes>>>> =
    LazyLock::new(Mutex::default);

/// The keys waited on in one database file, by this process: a counter per key, kept while a
/// waiter watches it.
#[derive(Debug)]
pub(crate) struct LocalWakes {
    path: PathBuf,
    keys: Mutex<HashMap<Vec<u8>, watch::Sender<u64>>>,
}

/// The canonical path of the database at `path` (absolute), or `path` itself if even its
/// directory cannot be resolved.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(file) = std::fs::canonicalize(path) {
        return file;
    }
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|dir| dir.join(name))
            .unwrap_or_else(|_| path.to_owned()),
        _ => path.to_owned(),
    }
}

impl LocalWakes {
    /// The registry of the database at `path` (absolute), shared with every other live handle
    /// of this process on the same file.
    pub(crate) fn for_database(path: &Path) -> Arc<Self> {
        let path = canonical(path);
        let mut databases = DATABASES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(live) = databases.get(&path).and_then(Weak::upgrade) {
            return live;
        }
        let wakes = Arc::new(LocalWakes {
            path: path.clone(),
            keys: Mutex::default(),
        });
        databases.insert(path, Arc::downgrade(&wakes));
        wakes
    }

    /// Watches `key` until the returned wait is dropped.
    pub(crate) fn subscribe(self: &Arc<Self>, key: &[u8]) -> LocalWait {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let receiver = keys
            .entry(key.to_vec())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        LocalWait {
            wakes: self.clone(),
            key: key.to_vec(),
            receiver: Some(receiver),
        }
    }

    /// Wakes this process's waiters on `key` (of any handle on the file). Costs a lookup when
    /// nobody here waits.
    pub(crate) fn wake(&self, key: &[u8]) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = keys.get(key) {
            sender.send_modify(|count| *count = count.wrapping_add(1));
        }
    }

    /// How many keys have a waiter now.
    #[cfg(test)]
    fn watched_keys(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for LocalWakes {
    fn drop(&mut self) {
        let mut databases = DATABASES.lock().unwrap_or_else(PoisonError::into_inner);
        // A handle built since this one's last reference went may have put a live one there.
        if databases
            .get(&self.path)
            .is_some_and(|entry| entry.strong_count() == 0)
        {
            databases.remove(&self.path);
        }
    }
}

/// One waiter's watch of one key; dropping it forgets the key once nobody else here waits on
/// it.
#[derive(Debug)]
pub(crate) struct LocalWait {
    wakes: Arc<LocalWakes>,
    key: Vec<u8>,
    /// `Some` until dropped. Receivers are made and dropped only under the registry's lock, so
    /// the count the drop reads is exact.
    receiver: Option<watch::Receiver<u64>>,
}

impl LocalWait {
    /// Marks every wake so far as seen: call before reading the key, so that a release
    /// committed after the read wakes [`LocalWait::changed`].
    pub(crate) fn mark_seen(&mut self) {
        if let Some(receiver) = self.receiver.as_mut() {
            receiver.borrow_and_update();
        }
    }

    /// Resolves at the first wake not yet seen.
    pub(crate) async fn changed(&mut self) {
        let Some(receiver) = self.receiver.as_mut() else {
            return std::future::pending().await;
        };
        // The sender stays in the registry while this receiver lives, so this never fails.
        if receiver.changed().await.is_err() {
            std::future::pending().await
        }
    }
}

#[cfg(test)]
impl LocalWait {
    /// Whether a wake not yet seen came.
    fn woken(&self) -> bool {
        self.receiver
            .as_ref()
            .is_some_and(|r| r.has_changed().unwrap_or(false))
    }
}

impl Drop for LocalWait {
    fn drop(&mut self) {
        let mut keys = self
            .wakes
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drop(self.receiver.take());
        if keys
            .get(&self.key)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_reaches_waiters_on_that_key_of_any_handle_on_the_file() {
        let dir = std::env::temp_dir().join(format!("lock-sqlite-local-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let one = LocalWakes::for_database(&dir.join("a.db"));
        // Another path to the same file, and another file.
        let same = LocalWakes::for_database(&dir.join(".").join("a.db"));
        let other = LocalWakes::for_database(&dir.join("b.db"));
        assert!(Arc::ptr_eq(&one, &same));
        assert!(!Arc::ptr_eq(&one, &other));

        let mut waiter = one.subscribe(b"k");
        let elsewhere = other.subscribe(b"k");
        let other_key = one.subscribe(b"j");
        waiter.mark_seen();
        assert!(!waiter.woken());
        same.wake(b"k");
        assert!(waiter.woken());
        waiter.changed().await;
        // Nothing for another key or another file.
        assert!(!elsewhere.woken());
        assert!(!other_key.woken());
        // Seen: the next wait waits for the next wake.
        waiter.mark_seen();
        assert!(!waiter.woken());
        one.wake(b"k");
        assert!(waiter.woken());

        // A key is forgotten with its last waiter.
        let second = one.subscribe(b"k");
        assert_eq!(one.watched_keys(), 2);
        drop(waiter);
        assert_eq!(one.watched_keys(), 2);
        drop(second);
        drop(other_key);
        assert_eq!(one.watched_keys(), 0);
        drop(elsewhere);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
