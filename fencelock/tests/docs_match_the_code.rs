//! Prose about the stores, checked against the code: the README's URL table lists every option
//! each store's URL parser reads (as the parser declares them), each store crate's tables of
//! options give every one with its declared default and no other,
//! its store chooser links every store's crate README, the facade's feature table and
//! docs/stores.md name every store, and docs/stores.md gives each store's default timeouts as
//! its parser applies them.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the facade lives in the workspace")
        .to_path_buf()
}

/// The rows of the first table in `path` (workspace-relative) whose header starts with
/// `header`, as `(cells)`: the header and the separator left out.
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

/// The options a store's URL parser reads, as it declares them.
fn options_read(kind: &fencelock::StoreKind) -> Vec<String> {
    (kind.options)()
        .iter()
        .map(|option| option.name.to_owned())
        .collect()
}

/// The option names a URL-table cell shows: every `name=…` in it.
fn options_shown(cell: &str) -> Vec<String> {
    cell.match_indices("=…")
        .map(|(at, _)| {
            let before = &cell[..at];
            let start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            before[start..].to_owned()
        })
        .collect()
}

#[test]
fn the_readme_url_table_lists_every_option_each_store_reads() {
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
        for option in options_read(kind) {
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

/// Each store's default connect and command timeouts as its URL parser applies them, by the
/// name docs/stores.md's table gives the store.
fn default_timeouts() -> Vec<(&'static str, Duration, Duration)> {
    let mut found = Vec::new();
    macro_rules! defaults {
        ($name:literal, $config:expr) => {{
            let config = $config.expect("the example URL parses");
            found.push(($name, config.connect_timeout(), config.command_timeout()));
        }};
    }
    #[cfg(feature = "redis")]
    {
        use fencelock::fencelock_redis::{RedisConfig, RedlockConfig};
        defaults!("Redis", RedisConfig::from_url("redis://h:6379"));
        defaults!(
            "Redis Cluster",
            RedisConfig::from_url("redis+cluster://h:7000")
        );
        defaults!(
            "Redlock",
            RedlockConfig::from_url("redlock://a:6379,b:6379,c:6379")
        );
    }
    #[cfg(feature = "etcd")]
    defaults!(
        "etcd",
        fencelock::fencelock_etcd::EtcdConfig::from_url("etcd://h:2379")
    );
    #[cfg(feature = "postgres")]
    defaults!(
        "PostgreSQL",
        fencelock::fencelock_postgres::PostgresConfig::from_url("postgres://u@h/db")
    );
    #[cfg(feature = "mysql")]
    defaults!(
        "MySQL / MariaDB",
        fencelock::fencelock_mysql::MysqlConfig::from_url("mysql://u@h/db")
    );
    #[cfg(feature = "sqlite")]
    defaults!(
        "SQLite",
        fencelock::fencelock_sqlite::SqliteConfig::from_url("sqlite:///x/locks.db")
    );
    #[cfg(feature = "zookeeper")]
    defaults!(
        "ZooKeeper",
        fencelock::fencelock_zookeeper::ZookeeperConfig::from_url("zookeeper://h:2181")
    );
    found
}

/// "5 s", "250 ms": as the docs write a duration.
fn shown(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

#[test]
fn docs_stores_gives_each_store_s_default_timeouts_as_the_code_does() {
    let rows = table_rows(
        "docs/stores.md",
        "| store | `connect_timeout` | `command_timeout` |",
    );
    let mut wrong = Vec::new();
    for (name, connect, command) in default_timeouts() {
        let Some(row) = rows
            .iter()
            .find(|row| row.get(1).is_some_and(|c| c == name))
        else {
            wrong.push(format!("{name}: no row"));
            continue;
        };
        let want = (shown(connect), shown(command));
        if (row[2].as_str(), row[3].as_str()) != (want.0.as_str(), want.1.as_str()) {
            wrong.push(format!(
                "{name}: the docs say {} / {}, the code {} / {}",
                row[2], row[3], want.0, want.1
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/stores.md's default timeouts: {wrong:?}"
    );
}

/// The facade's feature table has a row for every store of the facade's one list, named by
/// its feature, with each of its URL schemes; and `docs/stores.md` has a row for each scheme
/// family (the first scheme of each store, and Redis's Cluster and Redlock).
#[test]
fn the_feature_table_and_docs_stores_name_every_store() {
    let features = table_rows("fencelock/README.md", "| feature | what it adds |");
    let stores = table_rows("docs/stores.md", "| store | URL |");
    for kind in fencelock::STORES {
        if kind.name == fencelock::MEMORY.name {
            continue;
        }
        let feature = features
            .iter()
            .find(|row| {
                row.get(1)
                    .is_some_and(|c| c == &format!("`{}`", kind.feature))
            })
            .unwrap_or_else(|| {
                panic!(
                    "fencelock/README.md has no row for feature {}",
                    kind.feature
                )
            });
        for scheme in kind.schemes {
            assert!(
                feature[2].contains(&format!("`{scheme}://`")),
                "fencelock/README.md's {} row does not name {scheme}://",
                kind.feature
            );
        }
    }
    for kind in fencelock::STORES {
        let first = kind.schemes.first().expect("a scheme");
        assert!(
            stores
                .iter()
                .any(|row| row.get(2).is_some_and(|c| c == &format!("`{first}://`"))),
            "docs/stores.md has no row for {first}://"
        );
    }
}

/// The rows of every table headed `| option | default |` in a store crate: its README and the
/// doc comments of its sources.
fn option_tables(folder: &str) -> Vec<(String, Vec<String>)> {
    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let root = workspace().join(folder);
    let mut files = vec![root.join("README.md")];
    sources(&root.join("src"), &mut files);
    let mut rows = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let lines: Vec<&str> = text
            .lines()
            .map(|line| {
                let line = line.trim_start();
                line.strip_prefix("///")
                    .or_else(|| line.strip_prefix("//!"))
                    .map_or(line, str::trim_start)
            })
            .collect();
        let mut in_table = false;
        for line in lines {
            if line.starts_with("| option | default |") {
                in_table = true;
            } else if !line.starts_with('|') {
                in_table = false;
            } else if in_table && !line.starts_with("| ---") {
                let cells: Vec<String> = line.split('|').map(|c| c.trim().to_owned()).collect();
                rows.push((file.display().to_string(), cells));
            }
        }
    }
    rows
}

/// Each store crate's tables of options name every option its stores declare, with the
/// declared default (a cell may say more after it), and no option that none of them reads
/// (a client library's own, documented "as in" that library, aside).
#[test]
fn each_store_crate_s_option_tables_match_the_declarations() {
    let unticked = |text: &str| text.replace('`', "");
    let mut wrong = Vec::new();
    let mut folders: Vec<String> = fencelock::STORES
        .iter()
        .filter(|kind| !kind.feature.is_empty())
        .map(|kind| format!("lock-{}", kind.feature))
        .collect();
    folders.dedup();
    for folder in folders {
        let rows = option_tables(&folder);
        let declared: Vec<_> = fencelock::STORES
            .iter()
            .filter(|kind| format!("lock-{}", kind.feature) == folder)
            .flat_map(|kind| (kind.options)())
            .collect();
        assert!(
            !declared.is_empty(),
            "{folder}: no store declares an option"
        );
        for option in &declared {
            let shown = rows.iter().filter(|(_, cells)| {
                cells
                    .get(1)
                    .is_some_and(|c| c.split(", ").any(|n| n == format!("`{}`", option.name)))
            });
            let defaults: Vec<String> = shown.map(|(_, cells)| unticked(&cells[2])).collect();
            if defaults.is_empty() {
                wrong.push(format!("{folder}: no table row for {}", option.name));
            } else if !defaults
                .iter()
                .any(|d| d.starts_with(&unticked(option.default)))
            {
                wrong.push(format!(
                    "{folder}: {} defaults to {:?}, the tables say {defaults:?}",
                    option.name, option.default
                ));
            }
        }
        for (file, cells) in &rows {
            if cells.get(3).is_some_and(|c| c.starts_with("as in ")) {
                continue;
            }
            for name in cells[1].split(", ") {
                let name = name.trim_matches('`');
                if !declared.iter().any(|option| option.name == name) {
                    wrong.push(format!("{file}: {name} is in a table of options, not read"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the store crates' option tables: {wrong:#?}"
    );
}
