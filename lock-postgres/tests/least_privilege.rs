//! The store as a least-privilege role: the conformance suite (all but the cases that only
//! hold a lease over several TTLs) as a role that may only
//! connect, use schema `public` and SELECT, INSERT, UPDATE and DELETE on a fence table an
//! administrator made (with `create_table=false`), and the errors a role lacking a right gets.
//!
//! The roles live in databases of their own on the shared server
//! (`PostgresServer::least_privilege_role`), so no other test sees them.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fencelock_conformance::{async_trait, StoreFactory};
use fencelock_core::{DynLockStore, Error, LockStore, ReleaseOutcome};
use fencelock_postgres::{PostgresConfig, PostgresStore};
use sqlx::postgres::PgConnection;
use sqlx::{Connection, Row};
use test_servers::{closed_ports, shared};

/// Every right the store uses on its fence table (docs/security.md's list).
const ALL: &str = "SELECT, INSERT, UPDATE, DELETE";

/// The role that runs the conformance suite, and its database.
const ROLE: &str = "fencelock_least_privilege";
/// Its fence table, made by the administrator and fully granted.
const TABLE: &str = "fence_lp";
/// Granted everything but UPDATE.
const NO_UPDATE: &str = "fence_no_update";
/// Never created.
const MISSING: &str = "fence_missing";

/// A second role whose rights the tests revoke one at a time, in a database of its own.
const REVOKED_ROLE: &str = "fencelock_revoked";

/// A URL with `options` appended (and a generous connect timeout: other test processes may
/// load this machine).
fn with_options(url: &str, options: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}connect_timeout=30&{options}")
}

fn config(url: &str, options: &str) -> PostgresConfig {
    PostgresConfig::from_url(&with_options(url, options)).expect("config")
}

/// `(ddl, table, privileges)` for the least-privilege helper: the store's own DDL for `table`.
fn table(table: &str, privileges: &'static str) -> (String, String, &'static str) {
    let config = config(&shared::postgres().url(), &format!("table={table}"));
    (config.fence_table_ddl(), config.fence_table(), privileges)
}

/// Makes role `name` (once per process) with `tables`, and returns its URL.
fn role(
    cell: &'static OnceLock<String>,
    name: &str,
    tables: &[(String, String, &'static str)],
) -> String {
    cell.get_or_init(|| {
        let tables: Vec<(&str, &str, &str)> = tables
            .iter()
            .map(|(ddl, table, privileges)| (&**ddl, &**table, *privileges))
            .collect();
        tokio::task::block_in_place(|| {
            shared::postgres()
                .least_privilege_role(name, &tables)
                .unwrap_or_else(|e| panic!("{e}"))
        })
    })
    .clone()
}

/// The conformance role's URL.
fn role_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    role(
        &URL,
        ROLE,
        &[
            table(TABLE, ALL),
            table(NO_UPDATE, "SELECT, INSERT, DELETE"),
        ],
    )
}

/// The URL of the role whose rights are revoked, with one fully granted table per right.
fn revoked_role_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    let tables: Vec<_> = ["select", "insert", "update", "delete"]
        .iter()
        .map(|right| table(&format!("fence_needs_{right}"), ALL))
        .collect();
    role(&URL, REVOKED_ROLE, &tables)
}

/// The shared server's URL (its superuser) on `database`.
fn admin_url(database: &str) -> String {
    let mut url = url::Url::parse(&shared::postgres().url()).expect("server url");
    url.set_path(database);
    url.to_string()
}

/// A superuser connection to `database` on the shared server.
async fn admin(database: &str) -> PgConnection {
    PgConnection::connect(&admin_url(database))
        .await
        .expect("admin connection")
}

async fn connect(url: &str, options: &str) -> fencelock_core::Result<PostgresStore> {
    PostgresStore::connect(config(url, options)).await
}

/// The message of a non-retryable [`Error::Store`], or a panic naming what came instead.
fn store_error<T: std::fmt::Debug>(result: fencelock_core::Result<T>, what: &str) -> String {
    match result {
        Err(error @ Error::Store { .. }) => {
            assert!(!error.is_retryable(), "{what}: {error}");
            error.to_string()
        }
        other => panic!("{what}: expected a store error, got {other:?}"),
    }
}

struct LeastPrivilegeFactory {
    url: String,
}

#[async_trait]
impl StoreFactory for LeastPrivilegeFactory {
    async fn handle(&self) -> DynLockStore {
        let store = connect(&self.url, &format!("table={TABLE}&create_table=false"))
            .await
            .expect("connect as the least-privilege role");
        Arc::new(store)
    }

    async fn unreachable_handle(&self) -> DynLockStore {
        let port = closed_ports(1)[0];
        let config = PostgresConfig::from_url(&format!(
            "postgres://{ROLE}@127.0.0.1:{port}/{ROLE}?connect_timeout=1&command_timeout=1&create_table=false"
        ))
        .expect("config");
        Arc::new(PostgresStore::connect_lazy(config))
    }

    // `forget` is the default, `evict` through a handle of the same role: ending a backend of
    // one's own role needs no grant.
}

/// The suite as the role, four cases at a time. Left out: the cases that only hold a lease
/// over several TTLs (`HOLD_CASES`, 4 to 15 s each: they send no request the others do not
/// send), as `tests/conformance.rs` runs them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_as_the_least_privilege_role() {
    let factory = Arc::new(LeastPrivilegeFactory { url: role_url() });
    fencelock_conformance::expect_cases_except(factory, 4, fencelock_conformance::HOLD_CASES).await;
}

/// The role really is least-privilege: it may not create in the schema, holds no TEMPORARY
/// and is no superuser; so the suite above proves docs/security.md's list is enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_role_holds_only_the_listed_rights() {
    let url = role_url();
    let mut conn = PgConnection::connect(&url).await.expect("role connection");
    let row = sqlx::query(
        "SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolbypassrls,
                has_schema_privilege('public', 'CREATE'),
                has_schema_privilege('public', 'USAGE'),
                has_database_privilege(current_database(), 'CREATE'),
                has_database_privilege(current_database(), 'TEMPORARY'),
                has_table_privilege($1, 'SELECT'), has_table_privilege($1, 'INSERT'),
                has_table_privilege($1, 'UPDATE'), has_table_privilege($1, 'DELETE'),
                has_table_privilege($1, 'TRUNCATE'), has_table_privilege($1, 'REFERENCES'),
                has_table_privilege($1, 'TRIGGER')
           FROM pg_roles r WHERE r.rolname = current_user",
    )
    .bind(format!("public.{TABLE}"))
    .fetch_one(&mut conn)
    .await
    .expect("the role's rights");
    let rights: Vec<bool> = (0..15).map(|i| row.get(i)).collect();
    assert_eq!(
        rights,
        [
            false, false, false, false, // no superuser, CREATEDB, CREATEROLE, BYPASSRLS
            false, true, // schema: USAGE only
            false, false, // database: no CREATE, no TEMPORARY
            true, true, true, true, // the four rights on the fence table
            false, false, false, // and no other
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_with_create_table_false_is_refused_naming_the_table_and_the_ddl() {
    let url = role_url();
    let message = store_error(
        connect(&url, &format!("table={MISSING}&create_table=false")).await,
        "the role, create_table=false, no table",
    );
    for part in [
        &format!("\"public\".\"{MISSING}\" does not exist"),
        "create_table=false",
        "PostgresConfig::fence_table_ddl()",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    // A superuser could create it, but the option forbids it: nothing is created.
    let message = store_error(
        connect(
            &admin_url(ROLE),
            "table=fence_never&schema=never_made&create_table=false",
        )
        .await,
        "a superuser, create_table=false, no table",
    );
    assert!(
        message.contains("\"never_made\".\"fence_never\" does not exist (nor its schema"),
        "{message}"
    );
    let mut admin = admin(ROLE).await;
    let made: (bool, bool) = sqlx::query_as(
        "SELECT to_regnamespace('never_made') IS NOT NULL,
                to_regclass('never_made.fence_never') IS NOT NULL",
    )
    .fetch_one(&mut admin)
    .await
    .expect("catalog");
    assert_eq!(made, (false, false), "create_table=false created something");
}

/// Without CREATE on the schema (PostgreSQL 15's default for PUBLIC), the default
/// `create_table=true` meets the server's refusal: its text is kept, the operation named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_create_the_table_gets_the_servers_permission_denied() {
    let message = store_error(
        connect(&role_url(), &format!("table={MISSING}")).await,
        "the role, create_table=true, no table",
    );
    for part in [
        "creating the fence table",
        "permission denied for schema public",
        "create_table=false",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

/// Connecting checks the rights on the table and names the one missing, with the GRANT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_update_is_refused_naming_the_right_and_the_table() {
    let message = store_error(
        connect(
            &role_url(),
            &format!("table={NO_UPDATE}&create_table=false"),
        )
        .await,
        "the role without UPDATE",
    );
    let grant = format!("GRANT UPDATE ON \"public\".\"{NO_UPDATE}\" TO \"{ROLE}\"");
    for part in ["lacks UPDATE on the fence table", &grant] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

/// Each of the four rights (and USAGE on the schema) is needed: revoked after connecting, the
/// operation that uses it fails with the server's "permission denied", not retryable, and the
/// rights the store needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listed_right_is_needed() {
    let url = revoked_role_url();
    let mut admin = admin(REVOKED_ROLE).await;
    for right in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
        let table = format!("fence_needs_{}", right.to_lowercase());
        let store = connect(
            &url,
            &format!("table={table}&create_table=false&retention=2s&max_ttl=1s"),
        )
        .await
        .expect("connect with every right");
        // A key bumped once, so UPDATE is needed by the next bump's ON CONFLICT.
        let lease = store
            .try_acquire("k", Duration::from_secs(1))
            .await
            .expect("acquire");
        assert_eq!(
            store.release(&lease).await.expect("release"),
            ReleaseOutcome::Released
        );
        sqlx::query(&format!(
            "REVOKE {right} ON public.{table} FROM {REVOKED_ROLE}"
        ))
        .execute(&mut admin)
        .await
        .expect("revoke");
        let message = match right {
            "SELECT" => store_error(store.status("k").await, "status without SELECT"),
            "DELETE" => store_error(store.remove_idle_fences().await, "removal without DELETE"),
            _ => store_error(
                store.try_acquire("k", Duration::from_secs(1)).await,
                &format!("acquire without {right}"),
            ),
        };
        for part in [
            &format!("permission denied for table {table}"),
            "SELECT, INSERT, UPDATE and DELETE",
        ] {
            assert!(message.contains(part), "{right}: {part:?} not in {message}");
        }
        // And a new handle is refused at once, naming the right.
        let message = store_error(
            connect(&url, &format!("table={table}&create_table=false")).await,
            "connect after the revoke",
        );
        assert!(message.contains(&format!("lacks {right} on")), "{message}");
    }

    sqlx::query(&format!(
        "REVOKE USAGE ON SCHEMA public FROM {REVOKED_ROLE}"
    ))
    .execute(&mut admin)
    .await
    .expect("revoke usage");
    let message = store_error(
        connect(&url, "table=fence_needs_select&create_table=false").await,
        "connect without USAGE",
    );
    for part in [
        "permission denied for schema public",
        "USAGE on the fence table's schema",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

/// The table docs/security.md tells an administrator to create is the one this build makes
/// (a stale copy would be refused at connect, naming an upgrade the reader never needed).
#[test]
fn the_documented_fence_table_is_the_one_this_build_makes() {
    let docs = include_str!("../../docs/security.md");
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let config = PostgresConfig::from_url("postgres://locks@127.0.0.1/app").expect("a valid URL");
    let ddl = config.fence_table_ddl();
    assert!(
        words(docs).contains(&words(&ddl)),
        "docs/security.md must show PostgresConfig::fence_table_ddl() as it is:\n{ddl}"
    );
}
