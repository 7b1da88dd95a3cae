//! Prose about the stores, checked against the code: the README's URL table lists every option
//! each store's URL parser reads (taken from the parser's own answer to an unknown option),
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
