//! `lockctl ls [PREFIX] [--json] [--limit N]`: every held key under a prefix, one line each.

use std::process::ExitCode;

use fencelock::{DynLockStore, ListCursor};

use crate::status::describe;

/// Names read per page: the store pages; lockctl prints until the listing or `limit` ends.
const PAGE: usize = 100;

/// Prints the held keys under `prefix` in byte order, at most `limit` of them (every one when
/// `None`); exit 0 also when nothing is held.
pub(crate) async fn list(
    store: DynLockStore,
    prefix: &str,
    json: bool,
    limit: Option<usize>,
) -> ExitCode {
    let mut printed = 0;
    let mut from: Option<ListCursor> = None;
    loop {
        let page = match store.list(prefix, from.as_ref(), PAGE).await {
            Ok(page) => page,
            Err(error) => return crate::fail(&error),
        };
        for held in &page.keys {
            if limit.is_some_and(|limit| printed >= limit) {
                return ExitCode::SUCCESS;
            }
            if json {
                println!("{}", crate::to_json_line(held));
            } else {
                println!("{}", describe(&held.key, &held.status));
            }
            printed += 1;
        }
        match page.next {
            Some(next) => from = Some(next),
            None => return ExitCode::SUCCESS,
        }
    }
}
