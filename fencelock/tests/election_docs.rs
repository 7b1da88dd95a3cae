//! docs/election.md's table of stores says which notify an election's observers and which poll:
//! checked here against each store's source, so the page cannot drift from the code. A store
//! notifies exactly when its crate declares `with_notified_status(true)`.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the facade lives in the workspace")
        .to_path_buf()
}

/// The text of every `.rs` file under `dir`.
fn source(dir: &Path) -> String {
    let mut text = String::new();
    for entry in fs::read_dir(dir).expect("a source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            text.push_str(&source(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&fs::read_to_string(&path).expect("a source file"));
        }
    }
    text
}

#[test]
fn the_election_page_says_which_stores_notify_observers_as_the_code_does() {
    let root = workspace();
    let page = fs::read_to_string(root.join("docs/election.md")).expect("docs/election.md");
    // The table's first column names the store; its folder is the crate that implements it.
    let folders = [
        ("memory", "lock-core/src/memory.rs"),
        ("Redis", "lock-redis/src"),
        ("etcd", "lock-etcd/src"),
        ("PostgreSQL", "lock-postgres/src"),
        ("MySQL", "lock-mysql/src"),
        ("SQLite", "lock-sqlite/src"),
        ("ZooKeeper", "lock-zookeeper/src"),
    ];
    let rows: Vec<&str> = page
        .lines()
        .filter(|line| {
            line.starts_with("| ") && !line.starts_with("| store") && !line.starts_with("| ---")
        })
        .filter(|line| {
            line.ends_with("| notified |")
                || line.contains("| notified (")
                || line.ends_with("| polled |")
        })
        .collect();
    assert_eq!(rows.len(), folders.len(), "one row per store: {rows:#?}");
    for (store, folder) in folders {
        let row = rows
            .iter()
            .find(|row| row.trim_start_matches("| ").starts_with(store))
            .unwrap_or_else(|| panic!("docs/election.md has no row for {store}"));
        let path = root.join(folder);
        let code = if path.is_dir() {
            source(&path)
        } else {
            fs::read_to_string(&path).expect("a source file")
        };
        let notifies = code.contains("with_notified_status(true)");
        let says = row.contains("| notified");
        assert_eq!(
            says, notifies,
            "docs/election.md says {store}'s observers are {}, its code declares notified_status {notifies}",
            if says { "notified" } else { "polled" }
        );
    }
}
