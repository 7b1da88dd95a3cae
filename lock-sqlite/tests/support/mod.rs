//! What the tests share: a scratch directory removed with its owner, and a store on a file in
//! it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use fencelock_sqlite::{SqliteConfig, SqliteStore};

/// A new directory under the system's temporary directory, removed when dropped.
#[derive(Debug)]
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Self {
        Self::under(&std::env::temp_dir(), name)
    }

    /// A new directory under `base`.
    pub(crate) fn under(base: &Path, name: &str) -> Self {
        let dir = base.join(format!(
            "lock-sqlite-test-{name}-{}-{:016x}",
            std::process::id(),
            fencelock_core::OwnerId::random().as_u128() as u64
        ));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.0.join("locks.db")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) async fn store(path: &Path) -> SqliteStore {
    SqliteStore::connect(SqliteConfig::new(path))
        .await
        .expect("connect to a fresh database file")
}
