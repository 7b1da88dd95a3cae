//! The servers of one store's part of a bench that runs several stores one after another,
//! started by test-servers and stopped when dropped (SQLite: a file in a directory of its own).

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The servers of one store's part, stopped when dropped.
pub(crate) struct Running {
    pub(crate) url: String,
    _servers: Box<dyn std::any::Any>,
}

/// A directory removed when dropped: the SQLite part's file.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts the servers of `store` (`redis`, `redlock` on three masters, `postgres`, `mysql`,
/// `sqlite`) for the bench named `bench`.
pub(crate) fn start(store: &str, bench: &str) -> BenchResult<Running> {
    let (url, servers): (String, Box<dyn std::any::Any>) = match store {
        "redis" => {
            let server = test_servers::RedisServer::start()?;
            (server.url(), Box::new(server))
        }
        "redlock" => {
            let servers = test_servers::RedisServer::start_many(3)?;
            let hosts: Vec<String> = servers
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port()))
                .collect();
            (format!("redlock://{}", hosts.join(",")), Box::new(servers))
        }
        "postgres" => {
            let server = test_servers::PostgresServer::start()?;
            (server.url(), Box::new(server))
        }
        "mysql" => {
            let server = test_servers::MariadbServer::start()?;
            (server.url(), Box::new(server))
        }
        "sqlite" => {
            let dir = std::env::temp_dir()
                .join(format!("fencelock-{bench}-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite://{}", dir.join("locks.db").display());
            (url, Box::new(Scratch(dir)))
        }
        other => return Err(format!("unknown store {other:?}").into()),
    };
    Ok(Running {
        url,
        _servers: servers,
    })
}
