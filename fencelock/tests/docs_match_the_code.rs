//! Prose about the stores, checked against the code: the README's URL table lists every option
//! each store's URL parser reads (taken from the parser's own answer to an unknown option),
//! and its store chooser links every store's crate README.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the facade lives in the workspace")
        .to_path_buf()
}

fn table_rows(path: &str, header: &str) -> Vec<Vec<String>> {
    let text = fs::read_to_string(workspace().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip_while(|line| !line.starts_with(header))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| line.split('|').map(|c| c.trim().to_owned()).collect())
        .collect();
    assert!(!rows.is_empty(), "{path} has a table headed {header:?}");
    rows
}

/// The options a store's URL parser reads, from its refusal of an unknown one: "… reads a,
/// b, c and the libpq options …" or "… takes a, b and c". The client library's own options
/// (after " and the ") are passed through, and documented as such, not listed.
async fn options_read(example: &str) -> Vec<String> {
    let joiner = if example.contains('?') { '&' } else { '?' };
    let url = format!("{example}{joiner}no_such_option=1");
    let error = match fencelock::connect(&url).await {
        Ok(_) => panic!("{url}: an unknown option was accepted"),
        Err(error) => error.to_string(),
    };
    if error.ends_with("takes a name and no options") {
        return Vec::new();
    }
    let list = error
        .split_once(" reads ")
        .or_else(|| error.split_once(" takes "))
        .unwrap_or_else(|| panic!("{url}: the refusal names no options: {error}"))
        .1;
    let own = list.split(" and the ").next().unwrap_or(list);
    own.split(", ")
        .flat_map(|part| part.split(" and "))
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The option names a URL-table cell shows: every `name=…` in it.
fn options_shown(cell: &str) -> Vec<String> {
    cell.split(['?', '&', '['])
        .filter_map(|part| {
            part.split_once("=…")
                .map(|(name, _)| name.trim().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_readme_url_table_lists_every_option_each_store_reads() {
    let rows = table_rows("README.md", "| URL | store | feature |");
    let mut missing = Vec::new();
    for kind in fencelock::STORES {
        if kind.example.is_empty() {
            continue;
        }
        let scheme = kind.schemes[0];
        let row = rows
            .iter()
            .find(|row| {
                row.get(1)
                    .is_some_and(|c| c.starts_with(&format!("`{scheme}://")))
            })
            .unwrap_or_else(|| panic!("README.md's URL table has no row for {scheme}://"));
        let shown = options_shown(&row[1]);
        for option in options_read(kind.example).await {
            if !shown.contains(&option) {
                missing.push(format!("{scheme}:// {option}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's URL table leaves out options the parsers read: {missing:?}"
    );
}

#[test]
fn the_readme_store_chooser_links_every_store() {
    let rows = table_rows("README.md", "| store | pick it when | link |");
    let crates = fs::read_dir(workspace())
        .expect("the workspace")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("lock-") && name != "lock-core");
    for folder in crates {
        assert!(
            rows.iter().any(|row| row
                .get(3)
                .is_some_and(|c| c.contains(&format!("({folder}/README.md")))),
            "README.md's store chooser has no row linking {folder}/README.md"
        );
    }
    // One row per store this build has: Redis's three each have one.
    assert!(
        rows.len() >= fencelock::STORES.len(),
        "README.md's store chooser has {} rows for {} stores",
        rows.len(),
        fencelock::STORES.len()
    );
}
