//! Apache Curator's `InterProcessMutex`, the peer: `bench/peers/CuratorBench.java`,
//! compiled with `javac` when the bench starts and run in one JVM for the whole run, timing
//! its own loops with `System.nanoTime` (the loops the Rust side times its lock with) and
//! answering each command with the samples. The election bench runs its own peer class
//! (`CuratorElectionBench.java`) the same way ([`Curator::start_class`]).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use fencelock_bench::Samples;
use fencelock_core::{Error, Result};

const SOURCE: &str = include_str!("../../peers/CuratorBench.java");

/// The class path, each jar with the Debian package that installs it (the classes the program
/// loads, checked with `java -verbose:class`).
const JARS: [(&str, &str); 8] = [
    (
        "/usr/share/java/curator-recipes.jar",
        "libcurator-recipes-java",
    ),
    (
        "/usr/share/java/curator-framework.jar",
        "libcurator-recipes-java",
    ),
    (
        "/usr/share/java/curator-client.jar",
        "libcurator-recipes-java",
    ),
    ("/usr/share/java/guava.jar", "libcurator-recipes-java"),
    ("/usr/share/java/zookeeper.jar", "zookeeper"),
    ("/usr/share/java/zookeeper-jute.jar", "zookeeper"),
    ("/usr/share/java/slf4j-api.jar", "libcurator-recipes-java"),
    ("/usr/share/java/slf4j-nop.jar", "libcurator-recipes-java"),
];

/// The running JVM, its pipes and the directory its class was compiled into.
pub(crate) struct Curator {
    child: Child,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
    dir: PathBuf,
    java: PathBuf,
    /// The compiled class's directory, then the jars.
    class_path: String,
    class: String,
    /// How long `javac` took.
    pub compiled_in: Duration,
}

fn failed(message: impl Into<String>) -> Error {
    Error::Store {
        message: message.into(),
        source: None,
    }
}

/// `binary` on `PATH`, or an error naming the Debian package that installs it.
fn on_path(binary: &str, package: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(binary))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            failed(format!(
                "{binary} not found on PATH: the Curator peer is compiled at bench time \
                 (install Debian's {package})"
            ))
        })
}

impl Curator {
    /// Compiles the program and starts it with `clients` Curator clients (one ZooKeeper
    /// session each) on `connect` (`host:port,…`), waiting until they are connected.
    ///
    /// # Errors
    /// [`Error::Store`] naming the Debian package when `javac`, `java` or a jar is missing
    /// (`default-jdk-headless`, `libcurator-recipes-java`, `zookeeper`), and when the compile
    /// or the start fails.
    pub(crate) fn start(connect: &str, clients: usize) -> Result<Self> {
        Self::start_class("CuratorBench", SOURCE, &[connect, &clients.to_string()])
    }

    /// Compiles `source`, the Java class `class`, and starts it with `args`, waiting for its
    /// `READY` line.
    ///
    /// # Errors
    /// As [`Curator::start`].
    pub(crate) fn start_class(class: &str, source_text: &str, args: &[&str]) -> Result<Self> {
        let javac = on_path("javac", "default-jdk-headless")?;
        let java = on_path("java", "default-jdk-headless")?;
        for (jar, package) in JARS {
            if !Path::new(jar).is_file() {
                return Err(failed(format!(
                    "{jar} is missing (install Debian's {package})"
                )));
            }
        }
        let class_path = JARS.map(|(jar, _)| jar).join(":");
        let dir =
            std::env::temp_dir().join(format!("fencelock-zk-bench-{class}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::store("making the peer's directory", e))?;
        let source = dir.join(format!("{class}.java"));
        std::fs::write(&source, source_text)
            .map_err(|e| Error::store("writing the peer's source", e))?;
        let started = Instant::now();
        let compiled = Command::new(javac)
            .args(["-implicit:none", "-d"])
            .arg(&dir)
            .arg("-cp")
            .arg(&class_path)
            .arg(&source)
            .output()
            .map_err(|e| Error::store("running javac", e))?;
        if !compiled.status.success() {
            return Err(failed(format!(
                "javac {class}.java failed: {}",
                String::from_utf8_lossy(&compiled.stderr)
            )));
        }
        let compiled_in = started.elapsed();
        let class_path = format!("{}:{class_path}", dir.display());
        let mut child = Command::new(&java)
            .arg("-cp")
            .arg(&class_path)
            .arg(class)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::store("starting the Curator peer", e))?;
        let (Some(commands), Some(answers)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed("the Curator peer has no pipes"));
        };
        let mut curator = Curator {
            child,
            commands,
            answers: BufReader::new(answers),
            dir,
            java,
            class_path,
            class: class.to_owned(),
            compiled_in,
        };
        let ready = curator.line()?;
        if ready != "READY" {
            return Err(failed(format!(
                "the Curator peer said {ready:?}, not READY"
            )));
        }
        Ok(curator)
    }

    /// A command that runs the compiled class again, in a JVM of its own, with `args`.
    // Only the election bench runs a second JVM.
    #[allow(dead_code)]
    pub(crate) fn java(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.java);
        command
            .arg("-cp")
            .arg(&self.class_path)
            .arg(&self.class)
            .args(args);
        command
    }

    /// Sends one command line, answered by the lines [`Curator::line`] reads.
    ///
    /// # Errors
    /// [`Error::Store`] if the peer's stdin is closed.
    pub(crate) fn send(&mut self, command: &str) -> Result<()> {
        writeln!(self.commands, "{command}")
            .and_then(|()| self.commands.flush())
            .map_err(|e| Error::store("writing to the Curator peer", e))
    }

    /// The peer's next line. Blocks the thread.
    ///
    /// # Errors
    /// [`Error::Store`] if the peer exited.
    pub(crate) fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        let read = self
            .answers
            .read_line(&mut line)
            .map_err(|e| Error::store("reading the Curator peer", e))?;
        if read == 0 {
            return Err(failed("the Curator peer exited"));
        }
        Ok(line.trim_end().to_owned())
    }

    /// Runs one command (`cycle PATH N`, `handoff PATH N`, `quiet PATH N`) and returns its
    /// samples. Blocks the thread: call it from `block_in_place`.
    ///
    /// # Errors
    /// [`Error::Store`] with the peer's error, or if it exited.
    pub(crate) fn run(&mut self, command: &str) -> Result<Samples> {
        let answer = self.ask(command)?;
        samples(command, &answer)
    }

    /// Runs one command and returns its answer after `OK`. Blocks the thread.
    ///
    /// # Errors
    /// [`Error::Store`] with the peer's error, or if it exited.
    pub(crate) fn ask(&mut self, command: &str) -> Result<String> {
        self.send(command)?;
        let answer = self.line()?;
        match answer.strip_prefix("OK") {
            Some(rest) => Ok(rest.to_owned()),
            None => Err(failed(format!("Curator peer, {command}: {answer}"))),
        }
    }
}

/// The samples in an answer: nanoseconds separated by spaces.
///
/// # Errors
/// [`Error::Store`] for a word that is not a number.
pub(crate) fn samples(command: &str, answer: &str) -> Result<Samples> {
    answer
        .split_whitespace()
        .map(|ns| ns.parse().map(Duration::from_nanos))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map(Samples::new)
        .map_err(|e| Error::store(format!("Curator peer's answer to {command}"), e))
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = writeln!(self.commands, "quit").and_then(|()| self.commands.flush());
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
