//! `FencedFile` across processes: this test binary re-executes itself as the other holder
//! (`child_process_step`), so the two holders share nothing but the files.
#![cfg(target_os = "linux")]
// Unsafe only for system calls through libc; each block says why it is sound.
#![allow(unsafe_code)]

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_core::Error;
use fencelock_fence::FencedFile;

const STEP_ENV: &str = "FENCE_FILE_TEST_STEP";
const PATH_ENV: &str = "FENCE_FILE_TEST_PATH";

/// The entry point of the child processes the other tests start: runs the step named by
/// `FENCE_FILE_TEST_STEP` (`increment TOKEN` or `replace TOKEN CONTENTS`) on the file named by
/// `FENCE_FILE_TEST_PATH` and prints the outcome. Without them it does nothing.
#[test]
fn child_process_step() {
    let (Ok(step), Ok(path)) = (std::env::var(STEP_ENV), std::env::var(PATH_ENV)) else {
        return;
    };
    let file = FencedFile::new(path);
    let words: Vec<&str> = step.split(' ').collect();
    let outcome = match words.as_slice() {
        ["increment", token] => {
            let token = token.parse().expect("token");
            file.claim(token).and_then(|read| {
                let read = read.expect("contents");
                let n: u64 = String::from_utf8(read).expect("utf-8").parse().expect("n");
                file.write(token, (n + 1).to_string())
            })
        }
        ["replace", token, contents] => file.replace(token.parse().expect("token"), contents),
        other => panic!("unknown step {other:?}"),
    };
    println!("outcome: {outcome:?}");
}

fn spawn_step(path: &Path, step: &str) -> Child {
    Command::new(std::env::current_exe().expect("own binary"))
        .args([
            "--exact",
            "child_process_step",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STEP_ENV, step)
        .env(PATH_ENV, path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child step")
}

/// The child's outcome line, e.g. `Ok(())`.
fn outcome(child: Child) -> String {
    let output = child.wait_with_output().expect("child output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed: {stdout}");
    stdout
        .lines()
        .find_map(|l| l.split_once("outcome: ").map(|(_, o)| o))
        .unwrap_or_else(|| panic!("no outcome in {stdout}"))
        .to_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fence-file-test-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A (this process, token 1) claims and reads; B (another process, token 2) claims, reads and
/// writes; A's write is refused, and so is a later claim by a process with A's token.
#[test]
fn a_stale_holder_is_refused_after_a_newer_holder_in_another_process_wrote() {
    let dir = scratch("interleaving");
    let file = FencedFile::new(dir.join("counter"));
    file.replace(1, "10").expect("initial contents");

    let a_read = file.claim(1).expect("A claims").expect("contents");
    assert_eq!(a_read, b"10");
    assert_eq!(
        outcome(spawn_step(file.path(), "increment 2")),
        "Ok(())",
        "B's claim and write"
    );
    let refused = file.write(1, "11");
    assert!(
        matches!(
            refused,
            Err(Error::StaleToken {
                token: 1,
                highest: 2
            })
        ),
        "{refused:?}"
    );
    assert_eq!(fs::read_to_string(file.path()).expect("read"), "11");
    assert_eq!(fs::read_to_string(file.fence_path()).expect("read"), "2");
    let late = outcome(spawn_step(file.path(), "increment 1"));
    assert!(
        late.contains("StaleToken { token: 1, highest: 2 }"),
        "{late}"
    );
    let _ = fs::remove_dir_all(dir);
}

/// A writer that checked the token and has not renamed yet holds the lock; a newer holder's
/// step in another process waits for it, so the older rename can never land after the newer
/// one. The test plays the in-flight writer by holding the lock itself and watches
/// `/proc/locks` until the child is seen waiting, so no timing is assumed.
#[test]
fn a_step_in_another_process_waits_while_a_checked_write_is_in_flight() {
    let dir = scratch("in-flight");
    let file = FencedFile::new(dir.join("report"));
    file.replace(3, "three").expect("initial contents");

    let lock = File::options()
        .write(true)
        .open(file.lock_path())
        .expect("open the lock file");
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut child = spawn_step(file.path(), "replace 5 five");
    let started = Instant::now();
    while !waits_for_a_flock(child.id()) {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the newer holder's step finished ({status}) without waiting for the lock");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the newer holder's step never waited for the lock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The in-flight write lands, then the lock is released.
    fs::write(file.path(), "three, late").expect("the in-flight write");
    drop(lock);

    assert_eq!(outcome(child), "Ok(())");
    assert_eq!(fs::read_to_string(file.path()).expect("read"), "five");
    assert_eq!(fs::read_to_string(file.fence_path()).expect("read"), "5");
    let _ = fs::remove_dir_all(dir);
}

/// Whether `/proc/locks` lists process `pid` as blocked on a `flock` (a `->` line).
fn waits_for_a_flock(pid: u32) -> bool {
    let locks = fs::read_to_string("/proc/locks").expect("/proc/locks");
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"->")
            && fields.get(2) == Some(&"FLOCK")
            && fields.get(5) == Some(&pid.to_string().as_str())
    })
}

#[test]
fn replace_refuses_a_lower_token_and_keeps_the_contents() {
    let dir = scratch("replace");
    let file = FencedFile::new(dir.join("data"));
    assert_eq!(file.claim(4).expect("claim"), None, "no data yet");
    let refused = file.replace(3, "three");
    assert!(
        matches!(
            refused,
            Err(Error::StaleToken {
                token: 3,
                highest: 4
            })
        ),
        "{refused:?}"
    );
    assert!(!file.path().exists());
    file.replace(4, "four").expect("the claimant replaces");
    file.replace(6, "six").expect("a newer holder replaces");
    assert_eq!(fs::read(file.path()).expect("read"), b"six");
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_write_without_a_claim_is_refused_as_invalid_input() {
    let dir = scratch("unclaimed");
    let file = FencedFile::new(dir.join("data"));
    file.replace(2, "two").expect("replace");
    let refused = file.write(7, "seven");
    assert!(
        matches!(
            refused,
            Err(Error::InvalidInput {
                what: "fencing token",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(fs::read(file.path()).expect("read"), b"two");
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_fence_file_that_holds_no_token_is_a_store_error() {
    let dir = scratch("garbage");
    let file = FencedFile::new(dir.join("data"));
    fs::write(file.fence_path(), "not a token").expect("write");
    let result = file.claim(1);
    assert!(matches!(result, Err(Error::Store { .. })), "{result:?}");
    let _ = fs::remove_dir_all(dir);
}

/// The async steps leave the runtime's only thread free while they wait on the lock: another
/// task on a current-thread runtime runs (and here is what lets the lock go), and the claim
/// then completes.
#[tokio::test(flavor = "current_thread")]
async fn an_async_step_waiting_on_the_lock_leaves_the_runtime_free() {
    let path = scratch("async-free").join("report");
    let file = FencedFile::new(&path);
    file.replace(1, "1").unwrap();
    let holder = File::create(file.lock_path()).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    let (let_go, go) = std::sync::mpsc::channel::<()>();
    let released = std::thread::spawn(move || {
        // A bound so a blocked runtime fails the test instead of hanging it.
        let by_signal = go.recv_timeout(Duration::from_secs(30)).is_ok();
        drop(holder);
        by_signal
    });
    let (claimed, ()) = tokio::join!(file.claim_async(2), async {
        let_go.send(()).unwrap();
    });
    assert_eq!(claimed.unwrap().as_deref(), Some(&b"1"[..]));
    assert!(
        released.join().unwrap(),
        "the other task only ran once the claim had given up its thread"
    );
    file.write_async(2, "2").await.unwrap();
    let stale = file.replace_async(1, "0").await.unwrap_err();
    assert!(
        matches!(
            stale,
            Error::StaleToken {
                token: 1,
                highest: 2
            }
        ),
        "{stale:?}"
    );
    assert_eq!(fs::read(&path).unwrap(), b"2");
}
