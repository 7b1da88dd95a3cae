//! The README's service example (`examples/service.rs`) runs against a SQLite file, in the
//! build of the tests.
#![cfg(feature = "sqlite")]

#[path = "../examples/service.rs"]
mod service;

#[test]
fn the_readme_service_example_runs_on_a_sqlite_file() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "fencelock-service-{}-{nanos:x}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    // The only test of this binary, so no other thread reads the environment meanwhile.
    std::env::set_var("LOCK_URL", format!("sqlite://{}/locks.db", dir.display()));
    let result = service::main();
    let _ = std::fs::remove_dir_all(&dir);
    result.expect("the service example runs on SQLite");
}
