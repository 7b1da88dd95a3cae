//! The shared resource: three counter rows (and one fenced row per permit slot) on a
//! PostgreSQL server that no fault touches, and an append-only log of every accepted write,
//! ordered by the resource itself.
//!
//! Each write and its log row are one statement, so the log holds exactly the writes the
//! resource accepted, and its serial ids follow the order in which the row lock let them in.

use fencelock::{Error, Result};
use serde::Serialize;
use sqlx::{Connection, PgConnection, Row as _};

use crate::history::Row;

/// The futures of a worker's statements, boxed so a spawned worker's future is provably `Send`
/// (sqlx's executor bounds defeat the compiler's proof otherwise).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A fresh schema per store run, so one resource server serves a whole run.
const SETUP_SQL: &[&str] = &[
    "CREATE TABLE counters (id bigint PRIMARY KEY, value bigint NOT NULL, fence bigint NOT NULL DEFAULT 0)",
    "CREATE TABLE accepted (id bigserial PRIMARY KEY, row_id bigint NOT NULL, token bigint NOT NULL, \
     worker bigint NOT NULL, lease bigint NOT NULL, read_value bigint NOT NULL, new_value bigint NOT NULL)",
    "INSERT INTO counters (id, value) VALUES (1, 0), (2, 0), (3, 0)",
];

/// The claim (docs/fencing.md): records the token unless a greater one claimed
/// the row, and returns the value; one statement, so the check and the claim are one step.
/// `$1` row id, `$2` token.
const CLAIM_SQL: &str =
    "UPDATE counters SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING value";

/// A plain read, for the write-only and shadow rows. `$1` row id.
const READ_SQL: &str = "SELECT value FROM counters WHERE id = $1";

/// A slot row per permit slot, at 0. `$1` the number of slots.
const SETUP_SLOTS_SQL: &str =
    "INSERT INTO counters (id, value) SELECT 100 + s, 0 FROM generate_series(0, $1 - 1) AS s";

/// A reader's read: the value, unless a writer with a greater token claimed the row (a
/// reader's token is greater than every earlier writer's, so such a writer was let in while
/// the reader held the key). Claims nothing, so readers never refuse each other.
/// `$1` row id, `$2` token.
const READ_CHECKED_SQL: &str = "SELECT value FROM counters WHERE id = $1 AND fence < $2";

/// The fenced write: applies only while the row still carries the claim, and logs itself in
/// the same statement, so a write is accepted exactly when it is logged.
/// `$1` row id, `$2` token, `$3` new value, `$4` worker, `$5` lease.
const WRITE_FENCED_SQL: &str = "WITH w AS (
  UPDATE counters SET value = $3 WHERE id = $1 AND fence = $2 RETURNING value
) INSERT INTO accepted (row_id, token, worker, lease, read_value, new_value)
  SELECT $1, $2, $4, $5, $3 - 1, value FROM w RETURNING id";

/// The write checked only at the write (`fence < token`), logged in the same statement.
const WRITE_ONLY_CHECKED_SQL: &str = "WITH w AS (
  UPDATE counters SET value = $3, fence = $2 WHERE id = $1 AND fence < $2 RETURNING value
) INSERT INTO accepted (row_id, token, worker, lease, read_value, new_value)
  SELECT $1, $2, $4, $5, $3 - 1, value FROM w RETURNING id";

/// The unfenced write, logged in the same statement.
const WRITE_SHADOW_SQL: &str = "WITH w AS (
  UPDATE counters SET value = $3 WHERE id = $1 RETURNING value
) INSERT INTO accepted (row_id, token, worker, lease, read_value, new_value)
  SELECT $1, $2, $4, $5, $3 - 1, value FROM w RETURNING id";

/// The end state, read once every worker has stopped.
const VALUES_SQL: &str = "SELECT id, value FROM counters ORDER BY id";
const LOG_SQL: &str =
    "SELECT id, row_id, token, worker, lease, read_value, new_value FROM accepted ORDER BY id";

fn sql_error(what: &str, e: sqlx::Error) -> Error {
    Error::unavailable(format!("resource: {what}"), e)
}

/// Checks that a schema name is a plain identifier (it is interpolated into `SET search_path`).
fn check_schema(schema: &str) -> Result<()> {
    let plain = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if plain {
        Ok(())
    } else {
        Err(Error::invalid(
            "schema",
            "lowercase letters, digits and _ only",
        ))
    }
}

/// Drops and creates `schema` with the three rows and `slots` slot rows at 0 and an empty log.
///
/// # Cancel safety
/// Dropping the future may leave the schema half made; the next call starts over.
pub async fn setup(url: &str, schema: &str, slots: u32) -> Result<()> {
    check_schema(schema)?;
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|e| sql_error("connect", e))?;
    for sql in [
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        format!("CREATE SCHEMA {schema}"),
        format!("SET search_path TO {schema}"),
    ] {
        sqlx::raw_sql(&sql)
            .execute(&mut conn)
            .await
            .map_err(|e| sql_error("create the schema", e))?;
    }
    for sql in SETUP_SQL {
        sqlx::raw_sql(sql)
            .execute(&mut conn)
            .await
            .map_err(|e| sql_error("create the tables", e))?;
    }
    sqlx::query(SETUP_SLOTS_SQL)
        .bind(i64::from(slots))
        .execute(&mut conn)
        .await
        .map_err(|e| sql_error("create the slot rows", e))?;
    Ok(())
}

/// One worker's connection to the resource.
#[derive(Debug)]
pub struct Resource {
    conn: PgConnection,
}

impl Resource {
    /// Connects to the resource at `url`, working in `schema`.
    ///
    /// # Cancel safety
    /// Dropping the future drops the half-made connection.
    pub fn connect<'a>(url: &'a str, schema: &'a str) -> BoxFuture<'a, Result<Self>> {
        Box::pin(Self::connect_inner(url, schema))
    }

    async fn connect_inner(url: &str, schema: &str) -> Result<Self> {
        check_schema(schema)?;
        let mut conn = PgConnection::connect(url)
            .await
            .map_err(|e| sql_error("connect", e))?;
        let set = format!("SET search_path TO {schema}");
        sqlx::Executor::execute(&mut conn, set.as_str())
            .await
            .map_err(|e| sql_error("set the schema", e))?;
        Ok(Resource { conn })
    }

    /// Claims a fenced `row` (the fenced row or a slot's) with `token` and reads it; `None` if
    /// a greater token claimed it.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the claim made.
    pub fn claim(&mut self, row: Row, token: u64) -> BoxFuture<'_, Result<Option<i64>>> {
        Box::pin(async move {
            sqlx::query_scalar::<_, i64>(CLAIM_SQL)
                .bind(row.id())
                .bind(as_i64(token)?)
                .fetch_optional(&mut self.conn)
                .await
                .map_err(|e| sql_error("claim", e))
        })
    }

    /// Reads `row` without any check.
    ///
    /// # Cancel safety
    /// Read-only.
    pub fn read(&mut self, row: Row) -> BoxFuture<'_, Result<i64>> {
        Box::pin(async move {
            sqlx::query_scalar::<_, i64>(READ_SQL)
                .bind(row.id())
                .fetch_one(&mut self.conn)
                .await
                .map_err(|e| sql_error("read", e))
        })
    }

    /// A reader's read of `row` with `token`: `None` if a greater token claimed it.
    ///
    /// # Cancel safety
    /// Read-only.
    pub fn read_checked(&mut self, row: Row, token: u64) -> BoxFuture<'_, Result<Option<i64>>> {
        Box::pin(async move {
            sqlx::query_scalar::<_, i64>(READ_CHECKED_SQL)
                .bind(row.id())
                .bind(as_i64(token)?)
                .fetch_optional(&mut self.conn)
                .await
                .map_err(|e| sql_error("read", e))
        })
    }

    /// Writes `value` to `row` the way that row is written; the log id if it was accepted.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the write done (and logged) or not.
    pub fn write(
        &mut self,
        row: Row,
        token: u64,
        value: i64,
        worker: u32,
        lease: u64,
    ) -> BoxFuture<'_, Result<Option<i64>>> {
        let sql = match row {
            Row::Fenced | Row::Slot(_) => WRITE_FENCED_SQL,
            Row::WriteOnly => WRITE_ONLY_CHECKED_SQL,
            Row::Shadow => WRITE_SHADOW_SQL,
        };
        Box::pin(async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(row.id())
                .bind(as_i64(token)?)
                .bind(value)
                .bind(i64::from(worker))
                .bind(as_i64(lease)?)
                .fetch_optional(&mut self.conn)
                .await
                .map_err(|e| sql_error("write", e))
        })
    }
}

fn as_i64(n: u64) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::invalid("token", "at most i64::MAX for a bigint fence"))
}

/// One accepted write, as the resource logged it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Accepted {
    /// The log's serial id: the order the resource accepted the writes in.
    pub id: i64,
    /// The row written.
    pub row: Row,
    /// The writer's token.
    pub token: u64,
    /// The writer.
    pub worker: u32,
    /// The writer's lease number.
    pub lease: u64,
    /// The value the writer had read.
    pub read_value: i64,
    /// The value it wrote.
    pub new_value: i64,
}

/// The resource at the end of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ResourceState {
    /// The fenced row's value.
    pub fenced: i64,
    /// The write-only-checked row's value.
    pub write_only: i64,
    /// The shadow row's value.
    pub shadow: i64,
    /// Each permit slot row's value, by slot.
    pub slots: std::collections::BTreeMap<u32, i64>,
    /// Every accepted write, in the order the resource accepted them.
    pub accepted: Vec<Accepted>,
}

/// Reads the end state of `schema`.
///
/// # Cancel safety
/// Read-only.
pub async fn read_state(url: &str, schema: &str) -> Result<ResourceState> {
    let mut r = Resource::connect(url, schema).await?;
    let mut state = ResourceState::default();
    let rows = sqlx::query(VALUES_SQL)
        .fetch_all(&mut r.conn)
        .await
        .map_err(|e| sql_error("read the counters", e))?;
    for row in rows {
        let (id, value): (i64, i64) = (row.get(0), row.get(1));
        match Row::from_id(id) {
            Some(Row::Fenced) => state.fenced = value,
            Some(Row::WriteOnly) => state.write_only = value,
            Some(Row::Shadow) => state.shadow = value,
            Some(Row::Slot(slot)) => {
                state.slots.insert(slot, value);
            }
            None => {}
        }
    }
    let log = sqlx::query(LOG_SQL)
        .fetch_all(&mut r.conn)
        .await
        .map_err(|e| sql_error("read the log", e))?;
    for row in log {
        let Some(which) = Row::from_id(row.get(1)) else {
            continue;
        };
        state.accepted.push(Accepted {
            id: row.get(0),
            row: which,
            token: u64::try_from(row.get::<i64, _>(2)).unwrap_or(0),
            worker: u32::try_from(row.get::<i64, _>(3)).unwrap_or(0),
            lease: u64::try_from(row.get::<i64, _>(4)).unwrap_or(0),
            read_value: row.get(5),
            new_value: row.get(6),
        });
    }
    Ok(state)
}
