//! The fitness test of "one place per store": outside a store's own folder, its crate name, its
//! descriptor and its URL schemes appear only in the places CONTRIBUTING.md's "Adding a store"
//! names, so a new store is a one-folder change plus those lines.
//!
//! It reads every non-test `.rs` file and every `Cargo.toml` of the workspace (test files, a
//! crate's `tests/`, `benches/` and `examples/`, and `#[cfg(test)]` modules in files of their
//! own are left out: tests name the stores they start).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The places a store may be named outside its folder, as CONTRIBUTING.md lists them.
const ALLOWED: &[&str] = &[
    // The facade's one line per store (and its re-exports of the store crates).
    "fencelock/src/stores.rs",
    // The Cargo feature lines.
    "Cargo.toml",
    "fencelock/Cargo.toml",
    "lockctl/Cargo.toml",
    "nemesis/Cargo.toml",
    // The benchmarks' dev-dependencies (the benches themselves are in bench/benches/).
    "bench/Cargo.toml",
    // nemesis's fault table, keyed by store name.
    "nemesis/src/faults.rs",
    // The test-servers module of each server.
    "test-servers/",
    // The resource crate: its `postgres` and `redis` features and types are the databases it
    // fences (rows, keys), not stores; a new store never touches it.
    "fence/",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the facade lives in the workspace")
        .to_path_buf()
}

/// The files the test reads, relative to the workspace root.
fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let skipped = ["target", "tests", "benches", "examples", ".git", "docs"];
            if !skipped.contains(&name.as_str()) && !name.starts_with('.') {
                files(root, &path, out);
            }
        } else if (name.ends_with(".rs") && !name.ends_with("_tests.rs") && name != "tests.rs")
            || name == "Cargo.toml"
        {
            out.push(
                path.strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf(),
            );
        }
    }
}

/// A store: its folder, and the words that name it (crate names, descriptors, schemes).
struct Store {
    folder: String,
    words: Vec<String>,
}

/// Every `lock-*` folder but lock-core, with the descriptors its `descriptor.rs` declares and
/// the schemes the facade knows for them.
fn stores(root: &Path) -> Vec<Store> {
    let mut stores = Vec::new();
    for entry in fs::read_dir(root).expect("the workspace").flatten() {
        let folder = entry.file_name().to_string_lossy().into_owned();
        let Some(short) = folder.strip_prefix("lock-") else {
            continue;
        };
        if short == "core" || !entry.path().join("Cargo.toml").exists() {
            continue;
        }
        let mut words = vec![format!("fencelock-{short}"), format!("fencelock_{short}")];
        let descriptor = fs::read_to_string(entry.path().join("src/descriptor.rs"))
            .expect("every store has a descriptor.rs");
        let mut names = Vec::new();
        for piece in descriptor.split("pub const ").skip(1) {
            let ident: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if piece[ident.len()..].trim_start().starts_with(": StoreKind") {
                words.push(ident);
            }
            if let Some(name) = piece.split("StoreKind::new(").nth(1) {
                names.push(name.trim_start().split('"').nth(1).unwrap_or("").to_owned());
            }
        }
        for known in fencelock::KNOWN_STORES {
            if names.iter().any(|name| name == known.name) {
                for scheme in known.schemes {
                    words.push(format!("\"{scheme}\""));
                    words.push(format!("{scheme}://"));
                }
            }
        }
        stores.push(Store { folder, words });
    }
    stores.sort_by(|a, b| a.folder.cmp(&b.folder));
    stores
}

/// Whether `text` holds `word` on its own (not inside a longer identifier).
fn names(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let joined_before = word.starts_with(ident) && before.is_some_and(ident);
        let joined_after = word.ends_with(ident) && after.is_some_and(ident);
        !joined_before && !joined_after
    })
}

#[test]
fn a_store_is_named_outside_its_folder_only_where_contributing_says() {
    let root = workspace();
    let mut all = Vec::new();
    files(&root, &root, &mut all);
    let stores = stores(&root);
    assert!(stores.len() >= 5, "found the stores: {}", stores.len());
    let mut strays = BTreeSet::new();
    for file in &all {
        let shown = file.to_string_lossy();
        if ALLOWED.iter().any(|allowed| {
            shown == *allowed || (allowed.ends_with('/') && shown.starts_with(allowed))
        }) {
            continue;
        }
        let Ok(mut text) = fs::read_to_string(root.join(file)) else {
            continue;
        };
        // A file's own unit tests, by convention its last item, name the stores they use.
        if let Some(at) = text.find("\n#[cfg(test)]\nmod ") {
            text.truncate(at);
        }
        for store in &stores {
            if shown.starts_with(&format!("{}/", store.folder)) {
                continue;
            }
            for word in &store.words {
                if names(&text, word) {
                    strays.insert(format!("{shown} names {} ({word})", store.folder));
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "a store is named outside its folder and the places CONTRIBUTING.md's \"Adding a store\" \
         lists:\n{}",
        strays.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The README's URL table lists exactly the schemes of the facade's one list: every known
/// scheme has a row, and no row names a scheme the facade does not know.
#[test]
fn the_readme_url_table_is_the_facades_list() {
    let readme = fs::read_to_string(workspace().join("README.md")).expect("README.md");
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("| URL | store | feature |"))
        .take_while(|line| line.starts_with('|'))
        .collect();
    assert!(
        table.len() > 2,
        "README.md has a `| URL | store | feature |` table"
    );
    let mut shown = BTreeSet::new();
    for row in &table[2..] {
        let url_cell = row.split('|').nth(1).unwrap_or("");
        for piece in url_cell.split('`').skip(1).step_by(2) {
            if let Some((scheme, _)) = piece.split_once("://") {
                shown.insert(scheme.to_owned());
            }
        }
    }
    let known: BTreeSet<String> = fencelock::known_schemes().map(str::to_owned).collect();
    assert_eq!(
        shown, known,
        "the README's URL table and fencelock::KNOWN_STORES differ"
    );
}
