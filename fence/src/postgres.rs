//! A PostgreSQL row as a fenced resource, through sqlx.
//!
//! The row keeps the highest token that claimed it in a `bigint NOT NULL` fence column next
//! to its data. Names of the table and columns are identifiers: they are validated and always
//! double-quoted (so they are case-sensitive as written, like any quoted identifier); keys,
//! tokens and values are always bind parameters.

use fencelock_core::{Error, Result};
use sqlx::postgres::{PgArguments, PgConnection, PgRow, Postgres};
use sqlx::query::{Query, QueryScalar};
use sqlx::{Encode, FromRow, Type};

/// PostgreSQL truncates longer identifiers silently, which could name another object.
const MAX_IDENTIFIER_BYTES: usize = 63;

// The statements, built once per table from quoted names. Each is one statement, so each is
// atomic on its own: the row lock taken by the UPDATE orders it against any concurrent claim.

/// Claim: records the token if no greater one claimed the row, and returns its values.
/// `$1` key, `$2` token.
fn claim_sql(t: &Quoted) -> String {
    format!(
        "UPDATE {table} SET {fence} = $2 WHERE {key} = $1 AND {fence} <= $2 RETURNING {values}",
        table = t.table,
        fence = t.fence,
        key = t.key,
        values = t.values.join(", "),
    )
}

/// Write: sets the values only while the row still carries the claim. `$1` key, `$2` token,
/// `$3…` values.
fn write_sql(t: &Quoted) -> String {
    format!(
        "UPDATE {table} SET {set} WHERE {key} = $1 AND {fence} = $2",
        table = t.table,
        set = assignments(&t.values, 3),
        key = t.key,
        fence = t.fence,
    )
}

/// Upsert: inserts the row with the token, or overwrites it if no greater token claimed it.
/// One statement: the conflict check and the conditional update take the row lock together.
fn upsert_sql(t: &Quoted) -> String {
    let placeholders: Vec<String> = (0..t.values.len()).map(|i| format!("${}", i + 3)).collect();
    let overwrite: Vec<String> = t
        .values
        .iter()
        .map(|v| format!("{v} = EXCLUDED.{v}"))
        .collect();
    format!(
        "INSERT INTO {table} ({key}, {fence}, {values}) VALUES ($1, $2, {placeholders}) \
         ON CONFLICT ({key}) DO UPDATE SET {fence} = EXCLUDED.{fence}, {overwrite} \
         WHERE {table}.{fence} <= EXCLUDED.{fence}",
        table = t.table,
        key = t.key,
        fence = t.fence,
        values = t.values.join(", "),
        placeholders = placeholders.join(", "),
        overwrite = overwrite.join(", "),
    )
}

/// The row's fence, read after a refusal to say why. `$1` key.
fn fence_sql(t: &Quoted) -> String {
    format!(
        "SELECT {fence} FROM {table} WHERE {key} = $1",
        fence = t.fence,
        table = t.table,
        key = t.key,
    )
}

fn assignments(columns: &[String], first: usize) -> String {
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} = ${}", i + first))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names of a fenced table. All are identifiers, quoted when used.
#[derive(Debug, Clone, Copy)]
pub struct TableNames<'a> {
    /// The schema, or `None` for the connection's `search_path`.
    pub schema: Option<&'a str>,
    /// The table.
    pub table: &'a str,
    /// The key column: `PRIMARY KEY` or `UNIQUE` (the upsert needs one).
    pub key: &'a str,
    /// The fence column, `bigint NOT NULL DEFAULT 0`.
    pub fence: &'a str,
    /// The data columns a claim returns and a write sets, in this order (at least one).
    pub values: &'a [&'a str],
}

struct Quoted {
    table: String,
    key: String,
    fence: String,
    values: Vec<String>,
}

/// A table whose rows are fenced resources: [`claim`](FencedTable::claim) then
/// [`write`](FencedTable::write) for a read-modify-write, [`upsert`](FencedTable::upsert) for
/// a one-step write.
///
/// ```no_run
/// # async fn job(conn: &mut sqlx::PgConnection, token: u64) -> fencelock_core::Result<()> {
/// use fencelock_fence::{FencedTable, TableNames};
///
/// let counters = FencedTable::new(&TableNames {
///     schema: None,
///     table: "counters",
///     key: "id",
///     fence: "fence",
///     values: &["value"],
/// })?;
/// // Claim the row as we read it: from now on every lower token is refused.
/// let Some((value,)) = counters.claim::<_, (i64,)>(conn, 1_i64, token).await? else {
///     return Ok(()); // no such row
/// };
/// // ... compute for as long as it takes ...
/// counters.write(1_i64, token)?.bind(value + 1).execute(conn).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FencedTable {
    values: usize,
    claim: String,
    write: String,
    upsert: String,
    fence: String,
}

impl FencedTable {
    /// Validates and quotes the names and builds the statements. Names must be 1–63 bytes
    /// without NUL, and the value columns distinct from each other and from the key and fence.
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for no value column, a name given
    /// twice, or a name that is empty, over 63 bytes or holds NUL.
    pub fn new(names: &TableNames<'_>) -> Result<Self> {
        if names.values.is_empty() {
            return Err(Error::invalid("column name", "at least one value column"));
        }
        let mut all = vec![names.key, names.fence];
        all.extend_from_slice(names.values);
        for (i, name) in all.iter().enumerate() {
            if all[..i].contains(name) {
                return Err(Error::invalid(
                    "column name",
                    format!("{name:?} is named twice"),
                ));
            }
        }
        let table = match names.schema {
            Some(schema) => format!(
                "{}.{}",
                quote("schema name", schema)?,
                quote("table name", names.table)?
            ),
            None => quote("table name", names.table)?,
        };
        let quoted = Quoted {
            table,
            key: quote("column name", names.key)?,
            fence: quote("column name", names.fence)?,
            values: names
                .values
                .iter()
                .map(|v| quote("column name", v))
                .collect::<Result<_>>()?,
        };
        Ok(FencedTable {
            values: quoted.values.len(),
            claim: claim_sql(&quoted),
            write: write_sql(&quoted),
            upsert: upsert_sql(&quoted),
            fence: fence_sql(&quoted),
        })
    }

    /// Claims row `key` for `token` and returns its value columns, decoded as `R` (a tuple or
    /// a `FromRow` struct in the order of [`TableNames::values`]); `Ok(None)` if there is no
    /// such row. From then on every lower token is refused by this row. Refused with
    /// [`Error::StaleToken`] if a greater token claimed the row.
    ///
    /// A claim needs the row to exist: create it beforehand (or with
    /// [`upsert`](FencedTable::upsert)) when several holders may race to create it.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed the row;
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a token above `i64::MAX`;
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the connection fails (I/O);
    /// [`Store`](fencelock_core::ErrorKind::Store) for any other database error, or a row that
    /// changed under two claims in a row.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the claim made or not; either is safe, since a claim
    /// only refuses lower tokens. sqlx drains a connection left mid-statement before its
    /// next use.
    pub async fn claim<'q, K, R>(
        &'q self,
        conn: &mut PgConnection,
        key: K,
        token: u64,
    ) -> Result<Option<R>>
    where
        K: 'q + Encode<'q, Postgres> + Type<Postgres> + Clone + Send,
        R: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let bound = to_bind(token)?;
        // A second try covers a row created between the claim and the read of its fence.
        for _ in 0..2 {
            let claimed = sqlx::query_as::<_, R>(&self.claim)
                .bind(key.clone())
                .bind(bound)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| sql_error("claim", e))?;
            if claimed.is_some() {
                return Ok(claimed);
            }
            match self.read_fence(conn, key.clone()).await? {
                None => return Ok(None),
                Some(fence) if fence > token => {
                    return Err(Error::StaleToken {
                        token,
                        highest: fence,
                    })
                }
                Some(_) => continue,
            }
        }
        Err(Error::Store {
            message: "claim: the row changed under two claims in a row".into(),
            source: None,
        })
    }

    /// A write of row `key`'s value columns that applies only while the row still carries
    /// the claim `token`: bind the values in order, then [`FencedWrite::execute`].
    ///
    /// # Errors
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a token above `i64::MAX`. The
    /// refusals come from [`FencedWrite::execute`].
    pub fn write<'q, K>(&'q self, key: K, token: u64) -> Result<FencedWrite<'q>>
    where
        K: 'q + Encode<'q, Postgres> + Type<Postgres> + Clone + Send,
    {
        self.fenced(&self.write, "write", key, token)
    }

    /// The fenced insert, a one-step write: inserts row `key` with `token` and the bound
    /// values, or overwrites an existing row whose fence is not greater than `token` (its
    /// fence becomes `token`). For values that do not depend on an earlier read.
    ///
    /// # Errors
    /// As [`FencedTable::write`].
    pub fn upsert<'q, K>(&'q self, key: K, token: u64) -> Result<FencedWrite<'q>>
    where
        K: 'q + Encode<'q, Postgres> + Type<Postgres> + Clone + Send,
    {
        self.fenced(&self.upsert, "upsert", key, token)
    }

    fn fenced<'q, K>(
        &'q self,
        sql: &'q str,
        what: &'static str,
        key: K,
        token: u64,
    ) -> Result<FencedWrite<'q>>
    where
        K: 'q + Encode<'q, Postgres> + Type<Postgres> + Clone + Send,
    {
        let bound = to_bind(token)?;
        Ok(FencedWrite {
            what,
            token,
            expected: self.values,
            bound: 0,
            query: sqlx::query(sql).bind(key.clone()).bind(bound),
            fence: sqlx::query_scalar(&self.fence).bind(key),
        })
    }

    async fn read_fence<'q, K>(&'q self, conn: &mut PgConnection, key: K) -> Result<Option<u64>>
    where
        K: 'q + Encode<'q, Postgres> + Type<Postgres> + Send,
    {
        let fence: Option<i64> = sqlx::query_scalar(&self.fence)
            .bind(key)
            .fetch_optional(conn)
            .await
            .map_err(|e| sql_error("read the fence", e))?;
        Ok(fence.map(|f| u64::try_from(f).unwrap_or(0)))
    }

    /// The claim statement, with quoted names (`$1` key, `$2` token).
    pub fn claim_sql(&self) -> &str {
        &self.claim
    }

    /// The write statement (`$1` key, `$2` token, `$3…` values).
    pub fn write_sql(&self) -> &str {
        &self.write
    }

    /// The upsert statement (`$1` key, `$2` token, `$3…` values).
    pub fn upsert_sql(&self) -> &str {
        &self.upsert
    }
}

/// A fenced write or upsert with its key and token bound: bind one value per value column,
/// in order, then [`execute`](FencedWrite::execute).
#[must_use = "a write does nothing until it is executed"]
pub struct FencedWrite<'q> {
    what: &'static str,
    token: u64,
    expected: usize,
    bound: usize,
    query: Query<'q, Postgres, PgArguments>,
    fence: QueryScalar<'q, Postgres, i64, PgArguments>,
}

impl<'q> FencedWrite<'q> {
    /// Binds the next value column's value.
    pub fn bind<T>(mut self, value: T) -> Self
    where
        T: 'q + Encode<'q, Postgres> + Type<Postgres>,
    {
        self.query = self.query.bind(value);
        self.bound += 1;
        self
    }

    /// Runs the statement. Refused with [`Error::StaleToken`] if a greater token claimed the
    /// row; a write whose token never claimed the row, or whose row does not exist, is refused
    /// as [`Error::InvalidInput`]. Nothing is written on a refusal.
    ///
    /// # Errors
    /// [`StaleToken`](fencelock_core::ErrorKind::StaleToken) when a greater token claimed the row;
    /// [`InvalidInput`](fencelock_core::ErrorKind::InvalidInput) for a token that never claimed the
    /// row, a missing row, or a count of bound values other than the value columns';
    /// [`Unavailable`](fencelock_core::ErrorKind::Unavailable) when the connection fails (I/O);
    /// [`Store`](fencelock_core::ErrorKind::Store) for any other database error.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the write applied or not; if applied, it was applied
    /// whole and under a valid token. sqlx drains a connection left mid-statement before its
    /// next use.
    pub async fn execute(self, conn: &mut PgConnection) -> Result<()> {
        if self.bound != self.expected {
            return Err(Error::invalid(
                "values",
                format!("{} bound for {} value columns", self.bound, self.expected),
            ));
        }
        let what = self.what;
        let done = self
            .query
            .execute(&mut *conn)
            .await
            .map_err(|e| sql_error(what, e))?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        let fence: Option<i64> = self
            .fence
            .fetch_optional(conn)
            .await
            .map_err(|e| sql_error("read the fence", e))?;
        match fence {
            Some(fence) => Err(crate::refused(
                self.token,
                u64::try_from(fence).unwrap_or(0),
            )),
            None => Err(Error::invalid(
                "key",
                "no row with this key: create it before claiming it",
            )),
        }
    }
}

impl std::fmt::Debug for FencedWrite<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bound values are the caller's data: never printed.
        f.debug_struct("FencedWrite")
            .field("what", &self.what)
            .field("token", &self.token)
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// `name` as a quoted identifier: `"` doubled, so any name is data, never SQL.
fn quote(what: &'static str, name: &str) -> Result<String> {
    if name.is_empty() || name.len() > MAX_IDENTIFIER_BYTES {
        return Err(Error::invalid(
            what,
            format!("{name:?} must be 1-{MAX_IDENTIFIER_BYTES} bytes"),
        ));
    }
    if name.contains('\0') {
        return Err(Error::invalid(what, "must not contain NUL"));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

/// Tokens travel as `bigint`; none of fencelock's stores mint one beyond it.
fn to_bind(token: u64) -> Result<i64> {
    i64::try_from(token).map_err(|_| {
        Error::invalid(
            "fencing token",
            format!("{token} does not fit a PostgreSQL bigint"),
        )
    })
}

/// sqlx's error as ours: retryable only when the server could not be reached.
fn sql_error(what: &str, error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            Error::unavailable(format!("{what}: {error}"), error)
        }
        _ => Error::store(format!("{what}: {error}"), error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> FencedTable {
        FencedTable::new(&TableNames {
            schema: None,
            table: "counters",
            key: "id",
            fence: "fence",
            values: &["value"],
        })
        .expect("valid names")
    }

    #[test]
    fn statements_quote_every_name() {
        let t = counters();
        assert_eq!(
            t.claim_sql(),
            r#"UPDATE "counters" SET "fence" = $2 WHERE "id" = $1 AND "fence" <= $2 RETURNING "value""#
        );
        assert_eq!(
            t.write_sql(),
            r#"UPDATE "counters" SET "value" = $3 WHERE "id" = $1 AND "fence" = $2"#
        );
        assert_eq!(
            t.upsert_sql(),
            r#"INSERT INTO "counters" ("id", "fence", "value") VALUES ($1, $2, $3) ON CONFLICT ("id") DO UPDATE SET "fence" = EXCLUDED."fence", "value" = EXCLUDED."value" WHERE "counters"."fence" <= EXCLUDED."fence""#
        );
    }

    #[test]
    fn a_quote_in_a_name_is_doubled() {
        let t = FencedTable::new(&TableNames {
            schema: Some("a\"b"),
            table: "x\"; DROP TABLE y; --",
            key: "id",
            fence: "fence",
            values: &["v"],
        })
        .expect("valid names");
        assert!(
            t.write_sql()
                .starts_with(r#"UPDATE "a""b"."x""; DROP TABLE y; --" SET"#),
            "{}",
            t.write_sql()
        );
    }

    #[test]
    fn bad_names_are_refused() {
        let long = "n".repeat(64);
        for (table, values) in [
            ("", &["v"][..]),
            (long.as_str(), &["v"][..]),
            ("t\0", &["v"][..]),
            ("t", &[][..]),
            ("t", &["id"][..]),
            ("t", &["v", "v"][..]),
        ] {
            let result = FencedTable::new(&TableNames {
                schema: None,
                table,
                key: "id",
                fence: "fence",
                values,
            });
            assert!(
                matches!(result, Err(Error::InvalidInput { .. })),
                "{table:?} {values:?}: {result:?}"
            );
        }
    }

    #[test]
    fn a_token_beyond_bigint_is_refused() {
        assert!(matches!(
            counters().write(1_i64, u64::MAX),
            Err(Error::InvalidInput {
                what: "fencing token",
                ..
            })
        ));
    }
}
