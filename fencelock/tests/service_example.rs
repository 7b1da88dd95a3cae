//! The README's service example (`examples/service.rs`) runs against a SQLite file, in the
//! build of the tests.
#![cfg(all(feature = "sqlite", feature = "fence-file"))]

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
    // The only test of this binary that touches the environment, so no other thread reads it
    // meanwhile.
    std::env::set_var("LOCK_URL", format!("sqlite://{}/locks.db", dir.display()));
    // The report goes into the scratch dir too (`std::env::temp_dir` reads TMPDIR).
    std::env::set_var("TMPDIR", &dir);
    let result = service::main();
    let report = std::fs::read_to_string(dir.join("nightly-export.txt"));
    let _ = std::fs::remove_dir_all(&dir);
    result.expect("the service example runs on SQLite");
    let report = report.expect("the example wrote its report");
    assert!(
        report.starts_with("exported under fencing token "),
        "{report:?}"
    );
}

/// The README shows the example as it is: one text, compiled and run.
#[test]
fn the_readme_shows_the_service_example_as_it_is() {
    let example = include_str!("../examples/service.rs");
    let first_use = example.find("\nuse ").expect("the example's first `use`") + 1;
    let shown = &example[first_use..];
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(shown),
        "README.md must show examples/service.rs from its first `use` on, as it is"
    );
}
