#!/usr/bin/env python3
"""Runs the workspace's test binaries a few at a time, as `cargo test` would run them one by one.

    python3 scripts/run_tests.py [--jobs N] [--valkey SERVER] [-- ARGS...]

It builds every test binary once (`cargo test --workspace --all-features --no-run`), then runs
them concurrently, longest first, each from its package's folder with the environment cargo
gives it, and the doctests (`cargo test --doc`) beside them. Most binaries spend their time
waiting on TTL timers and servers, so running them side by side costs little CPU and saves
most of the wall time. Each binary keeps its own servers (test-servers shares a server per
process) and its own test threads, exactly as under `cargo test`.

With `--valkey SERVER`, the binaries named in VALKEY run a second time in the same pool, their
Redis servers started from SERVER (`LOCK_TEST_REDIS_SERVER`), with the arguments given there.

A binary named in EXCLUSIVE runs with nothing else running. Prints every failing binary's
output, then the slowest ten binaries, and exits 1 if any failed. Python's standard library
only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

# Seconds each binary took in a run (2026-11-27, four at a time): the order to start them in,
# longest first, so the last to finish is not a long one started late. Unknown binaries count
# as 5 s. Only the order depends on these figures, never a result.
EXPECTED = {
    "fencelock-zookeeper::faults": 67,
    "nemesis::short": 66,
    "lockctl::stores": 45,
    "fencelock-etcd::conformance": 42,
    "fencelock-etcd::cluster": 37,
    "lockctl::cli": 31,
    "fencelock-etcd::stopped_member": 29,
    "fencelock-redis::sentinel": 37,
    "fencelock-redis::conformance": 29,
    "fencelock-mysql::conformance": 28,
    "fencelock-zookeeper::ensemble": 28,
    "fencelock-zookeeper::conformance": 27,
    "fencelock-etcd::least_privilege": 27,
    "fencelock-redis::cluster": 27,
    "fencelock-postgres::conformance": 26,
    "fencelock-postgres::least_privilege": 23,
    "fencelock-redis::redlock": 22,
    "fencelock-redis::redlock_faults": 18,
    "fencelock-redis::sentinel_faults": 18,
    "fencelock-etcd::faults": 17,
}

# The Redis store's conformance suite (its own layout), its mode and waiting scripts, and the
# CLI contract on one server: what runs again against Valkey (`--valkey`), with the libtest
# arguments that pick those tests.
VALKEY = {
    "fencelock-redis::conformance": ["--skip", "plain_layout::"],
    "fencelock-redis::modes": [],
    "fencelock-redis::waiting": [],
    "lockctl::stores": ["redis::"],
}

# How a Valkey run of a binary is named in the output.
VALKEY_RUN = "valkey: "


def expected(name):
    """The seconds a job is expected to take (EXPECTED); a Valkey run counts as its binary's."""
    return EXPECTED.get(name.removeprefix(VALKEY_RUN), 5)

# Binaries that must have the machine to themselves (none so far: every test's margins come
# from its contract, not from an idle machine). Name them as in EXPECTED.
EXCLUSIVE = set()


def build(extra_env):
    """Builds every test binary; returns [(name, executable, package folder)]."""
    command = [
        "cargo", "test", "--workspace", "--all-features", "--no-run",
        "--message-format=json-render-diagnostics",
    ]
    result = subprocess.run(command, stdout=subprocess.PIPE, env=extra_env, text=True)
    if result.returncode != 0:
        sys.exit(result.returncode)
    binaries = []
    for line in result.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact":
            continue
        if not message["profile"]["test"] or not message.get("executable"):
            continue
        folder = os.path.dirname(message["manifest_path"])
        package = package_name(message["manifest_path"]) or os.path.basename(folder)
        target = message["target"]
        name = package if target["kind"] == ["lib"] else f"{package}::{target['name']}"
        binaries.append((name, message["executable"], folder))
    return sorted(set(binaries))


def cpu_times():
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(f) for f in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def package_name(manifest_path):
    """The `name` of a manifest's [package] section."""
    in_package = False
    with open(manifest_path, encoding="utf-8") as manifest:
        for line in manifest:
            line = line.strip()
            if line.startswith("["):
                in_package = line == "[package]"
            elif in_package and line.startswith("name"):
                return line.split("=", 1)[1].strip().strip('"')
    return None


class Pool:
    """Runs jobs at most `jobs` at a time; an exclusive job waits for an empty pool."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.running = 0
        self.exclusive = False
        self.cond = threading.Condition()
        self.results = []

    def run(self, name, command, folder, env, exclusive):
        with self.cond:
            while (self.exclusive or self.running >= self.jobs
                   or (exclusive and self.running > 0)):
                self.cond.wait()
            self.running += 1
            self.exclusive = exclusive
        thread = threading.Thread(
            target=self._run, args=(name, command, folder, env), daemon=True)
        thread.start()
        return thread

    def _run(self, name, command, folder, env):
        started = time.monotonic()
        with tempfile.TemporaryFile(mode="w+") as log:
            child = subprocess.Popen(command, cwd=folder, env=env, stdout=log,
                                     stderr=subprocess.STDOUT)
            # wait4's usage counts the binary and every process it waited for: its servers.
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = code = os.waitstatus_to_exitcode(status)
            log.seek(0)
            output = log.read()
        elapsed = time.monotonic() - started
        cpu = usage.ru_utime + usage.ru_stime
        with self.cond:
            self.results.append((name, code, elapsed, output, cpu))
            self.running -= 1
            self.exclusive = False
            self.cond.notify_all()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("TEST_JOBS", "4")))
    parser.add_argument("--valkey", metavar="SERVER",
                        help="also run the VALKEY binaries against this valkey-server")
    parser.add_argument("args", nargs="*", help="passed to every test binary")
    options = parser.parse_args()

    env = dict(os.environ)
    binaries = build(env)
    started = time.monotonic()
    cpu_before = cpu_times()
    pool = Pool(options.jobs)
    jobs = [(name, [path, *options.args], folder, {}) for name, path, folder in binaries]
    if options.valkey:
        found = {name for name, _, _ in binaries}
        if not VALKEY.keys() <= found:
            sys.exit(f"no test binary named {sorted(VALKEY.keys() - found)}")
        jobs += [(VALKEY_RUN + name, [path, *VALKEY[name], *options.args], folder,
                  {"LOCK_TEST_REDIS_SERVER": options.valkey})
                 for name, path, folder in binaries if name in VALKEY]
    doc = ("doctests", ["cargo", "test", "--workspace", "--all-features", "--doc", "-q"],
           os.getcwd())
    # Longest first; the doctests (they compile each block) count as long.
    jobs.sort(key=lambda job: -expected(job[0]))
    threads = [pool.run(*doc, env, False)]
    for name, command, folder, extra in jobs:
        job_env = dict(env, CARGO_MANIFEST_DIR=folder, **extra)
        threads.append(pool.run(name, command, folder, job_env, name in EXCLUSIVE))
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    cpu_after = cpu_times()

    passed = failed = 0
    for name, code, elapsed, output, _ in pool.results:
        for match in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed", output):
            passed += int(match.group(1))
            failed += int(match.group(2))
    failures = [r for r in pool.results if r[1] != 0]
    for name, code, elapsed, output, _ in failures:
        print(f"==> FAILED: {name} (exit {code}, {elapsed:.1f} s)")
        print(output)
    print(f"==> {len(pool.results)} test binaries (doctests included), {options.jobs} at a time:"
          f" {passed} tests passed, {failed} failed, {wall:.0f} s wall,"
          f" {sum(r[2] for r in pool.results):.0f} s summed")
    # How busy the machine was: whether more binaries at a time would shorten the run, or
    # only load the CPUs the tests' timers run on.
    if cpu_before and cpu_after and cpu_after[1] > cpu_before[1]:
        busy = (cpu_after[0] - cpu_before[0]) / (cpu_after[1] - cpu_before[1])
        print(f"==> CPUs busy {busy:.0%} of the run ({os.cpu_count()} CPUs, every process)")
    # Shared servers end with their test process (parent-death signal) and are never waited
    # for: their time is not in these figures.
    print(f"==> CPU time of the binaries and the servers they waited for:"
          f" {sum(r[4] for r in pool.results):.0f} s")
    print("slowest ten (wall, then CPU of the binary and the servers it waited for):")
    for name, code, elapsed, _, cpu in sorted(pool.results, key=lambda r: -r[2])[:10]:
        print(f"  {elapsed:6.1f} s {cpu:6.1f} s  {name}{'' if code == 0 else '  FAILED'}")
    print("most CPU ten:")
    for name, code, elapsed, _, cpu in sorted(pool.results, key=lambda r: -r[4])[:10]:
        print(f"  {elapsed:6.1f} s {cpu:6.1f} s  {name}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
