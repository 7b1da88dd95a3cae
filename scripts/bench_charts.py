#!/usr/bin/env python3
"""Charts (SVG) of one scripts/bench.sh run, drawn from the run's text and nothing else.

    python3 scripts/bench_charts.py RUN.txt OUTDIR          write the charts into OUTDIR
    python3 scripts/bench_charts.py --check RUN.txt OUTDIR  regenerate into a temporary
        directory and compare: exit 1 naming every file that differs, is missing or is extra

RUN.txt is either a scripts/bench.sh run or one bench's output kept whole under a first line
'# cargo bench -p fencelock-bench --bench NAME, STAMP, …' (the election
benches, BENCHES below). The election benches print their figures among prose and, for the
stores without a peer, store by store: their sections are read leniently (LENIENT).

The output is a pure function of RUN.txt's bytes and file name (no clock, no randomness, no environment,
fixed number formatting, fixed order), so the checked-in charts can be compared byte for byte.
Python 3 standard library only.

Every bar is one figure exactly as the run printed it (its text is copied, never reformatted);
a chart names the row it came from, the section's command, and the run. The charts are chosen
below (CHARTS); a row they name that the run does not have (unless the stored run predates
it: ADDED, ADDED_ROWS), a section the script has no charts for, a section a full run must have
but this one lacks, or a line that is neither a row, a note nor a section marker stops the
script with exit status 2 and the line it could not read.
"""

import os
import re
import shutil
import sys
import tempfile

# ---------------------------------------------------------------------------------------------
# Parsing


class ParseError(Exception):
    pass


NUMBER_UNIT = re.compile(r"(-?\d+(?:\.\d+)?)(?: ?(µs|ms|s|/s|B|MiB))?")
# `inf×`: a ratio to an empty sample, which the bench printed before it left such rows out.
RATIO = re.compile(r"-?\d+(?:\.\d+)?×|inf×")
SECTION = re.compile(r"## (\S+): (cargo (?:run|bench) .+)")
TRAILER = re.compile(r"\((\S+) took (\d+) s; load average [\d. ]+\)")
RUN_HEADER = re.compile(r"# scripts/bench\.sh, (\S+), .+")
# A run of one bench: `cargo bench -p fencelock-bench --bench NAME`, or as runs stored before
# the benches had a crate of their own name it, `cargo run --release -p PACKAGE --example NAME`.
BENCH_HEADER = re.compile(
    r"# (cargo run --release -p (\S+) (?:--features (\S+) )?--example (\S+)"
    r"|cargo bench -p (fencelock-bench) ()--bench (\S+)), (\S+), .+")
# a bench's own last line
BENCH_END = re.compile(r"\((?:took \d+ s; )?load average after: [\d. ]+\)")
# one store's part of a bench that runs several, up to its "(store took N s; …)" line
STORE_BLOCK = re.compile(r"(\S+) at (\S+) \(servers up in [\d.]+ s\)")
SAMPLES_P99 = re.compile(r"(raw [^,;]+?) p99 (\d+(?:\.\d+)?) µs")


class Row:
    def __init__(self, lineno, indent, label, value, ratio, target):
        self.lineno = lineno
        self.indent = indent
        self.label = label
        self.value = value  # text as printed, or None when the row has only a ratio
        self.ratio = ratio  # "1.12×" or None
        self.target = target  # "target …: met" or None
        self.number = None
        self.unit = None
        if value is not None:
            m = NUMBER_UNIT.fullmatch(value)
            if m:
                self.number = float(m.group(1))
                self.unit = m.group(2) or ""


class Section:
    def __init__(self, name, command, lineno, where=None):
        self.name = name
        self.command = command
        self.lineno = lineno
        self.where = where  # a store block's first line: the store and its URL
        self.header = []  # prose lines before the rows
        self.rows = []
        self.notes = []  # (line number, prose line) after the rows
        self.took = None


class Run:
    def __init__(self, stamp, header, bench=None):
        self.stamp = stamp
        self.header = header
        self.bench = bench  # the bench's name when the file is one bench's output
        self.sections = []

    def section(self, name):
        for s in self.sections:
            if s.name == name:
                return s
        return None


def parse_row(lineno, line):
    stripped = line.strip(" ")
    indent = len(line) - len(line.lstrip(" "))
    fields = re.split(r" {2,}", stripped)
    label, rest = fields[0], fields[1:]
    value = ratio = target = None
    i = 0
    if i < len(rest) and not RATIO.fullmatch(rest[i]) and not rest[i].startswith("target "):
        value = rest[i]
        i += 1
    if i < len(rest) and RATIO.fullmatch(rest[i]):
        ratio = rest[i]
        i += 1
    if i < len(rest) and rest[i].startswith("target "):
        target = rest[i]
        i += 1
    if i != len(rest) or (value is None and ratio is None):
        raise ParseError(f"line {lineno}: not a row (label, value, ratio, target): {line!r}")
    return Row(lineno, indent, label, value, ratio, target)


def parse_lenient(name, command, lineno, lines):
    """The sections of an election bench's output: [(line number, line)] after its command.

    Any line with two spaces between fields is a row, any other prose: the header before the
    first row, a note after it. A bench that runs several stores prints each in a block, from
    'store at URL (servers up in …)' to '(store took N s; …)': one section each, named
    'name/store'."""
    top = Section(name, command, lineno)
    blocks = []
    block = None
    last = lineno
    for n, raw in lines:
        last = n
        line = raw.rstrip(" ")
        if line == "" or line.startswith("# ") or BENCH_END.fullmatch(line):
            continue
        m = STORE_BLOCK.fullmatch(line)
        if m:
            if block is not None:
                raise ParseError(f"line {n}: a store block starts inside {block.name!r}'s "
                                 f"(line {block.lineno}): {raw!r}")
            block = Section(f"{name}/{m.group(1)}", command, n, where=line)
            blocks.append(block)
            continue
        cur = block if block is not None else top
        m = TRAILER.fullmatch(line)
        if m:
            if block is None or m.group(1) != block.name.split("/")[1]:
                raise ParseError(f"line {n}: a store's trailer outside its block: {raw!r}")
            if not block.rows:
                raise ParseError(f"line {n}: {block.name!r} ends with no figures: {raw!r}")
            block.took = int(m.group(2))
            block = None
            continue
        if re.search(r"\S {2,}\S", line):
            cur.rows.append(parse_row(n, line))
        elif cur.rows:
            cur.notes.append((n, line))
        else:
            cur.header.append(line)
    if block is not None:
        raise ParseError(f"line {last}: {block.name!r} (line {block.lineno}) has no "
                         f"'(store took N s; …)' line: the run was cut short")
    if blocks:
        if top.rows:
            raise ParseError(f"line {top.rows[0].lineno}: a row outside every store's block")
        return blocks
    if not top.rows:
        raise ParseError(f"line {lineno}: {name!r} has no figures")
    return [top]


# The benches a file of one bench's output may hold, by (package, example), named as
# scripts/bench.sh names them; each is read leniently.
BENCHES = {
    ("fencelock-bench", "etcd-election"): "etcd-election",
    ("fencelock-bench", "zookeeper-election"): "zookeeper-election",
    ("fencelock-bench", "stores-election"): "stores-election",
    ("fencelock-etcd", "election_bench"): "etcd-election",
    ("fencelock-zookeeper", "election_bench"): "zookeeper-election",
    ("fencelock", "election_bench"): "stores-election",
}
LENIENT = set(BENCHES.values())


def parse_bench(text):
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    m = BENCH_HEADER.fullmatch(lines[0]) if lines else None
    if not m:
        raise ParseError("line 1: neither a scripts/bench.sh run header nor a "
                         "'# cargo bench -p fencelock-bench --bench …, STAMP, …' one")
    package, bench = (m.group(2), m.group(4)) if m.group(2) else (m.group(5), m.group(7))
    name = BENCHES.get((package, bench))
    if name is None:
        raise ParseError(f"line 1: no charts for the bench of {m.group(1)!r}; add it to "
                         f"BENCHES in scripts/bench_charts.py")
    if not any(BENCH_END.fullmatch(line.rstrip(" ")) for line in lines):
        raise ParseError(f"line {len(lines)}: no '(took N s; load average after: …)' line: "
                         f"the run was cut short")
    run = Run(m.group(8), lines[0][2:], bench=name)
    run.sections = parse_lenient(name, m.group(1), 1, list(enumerate(lines[1:], start=2)))
    return run


def parse(text):
    if not text.startswith("# scripts/bench.sh"):
        return parse_bench(text)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise ParseError("line 1: empty file")
    m = RUN_HEADER.fullmatch(lines[0])
    if not m:
        raise ParseError(f"line 1: not a scripts/bench.sh run header: {lines[0]!r}")
    run = Run(m.group(1), lines[0][2:])
    cur = None
    state = None  # "header", "rows", "notes", "done"
    for n, raw in enumerate(lines[1:], start=2):
        line = raw.rstrip(" ")
        if line == "":
            if cur is not None and state == "header" and cur.header:
                state = "rows"
            elif cur is not None and state == "rows" and cur.rows:
                state = "notes"
            continue
        m = SECTION.fullmatch(line)
        if m:
            if cur is not None and state != "done":
                raise ParseError(f"line {n}: section {cur.name!r} (line {cur.lineno}) has no "
                                 f"'({cur.name} took N s; …)' line before the next one: {raw!r}")
            if run.section(m.group(1)):
                raise ParseError(f"line {n}: section {m.group(1)!r} appears twice: {raw!r}")
            cur = Section(m.group(1), m.group(2), n)
            state = "header"
            if cur.name in LENIENT:
                state = "lenient"
                body = []
                continue
            if cur.name in UNCHARTED:
                state = "uncharted"
                continue
            run.sections.append(cur)
            continue
        if state == "uncharted":
            m = TRAILER.fullmatch(line)
            if m and m.group(1) == cur.name:
                state = "done"
            continue
        if state == "lenient":
            m = TRAILER.fullmatch(line)
            if m and m.group(1) == cur.name:
                for sub in parse_lenient(cur.name, cur.command, cur.lineno, body):
                    if run.section(sub.name):
                        raise ParseError(f"line {sub.lineno}: section {sub.name!r} appears "
                                         f"twice")
                    run.sections.append(sub)
                state = "done"
            else:
                body.append((n, raw))
            continue
        if cur is None or state == "done":
            raise ParseError(f"line {n}: outside any section: {raw!r}")
        m = TRAILER.fullmatch(line)
        if m:
            if m.group(1) != cur.name:
                raise ParseError(f"line {n}: trailer names {m.group(1)!r} in section "
                                 f"{cur.name!r}: {raw!r}")
            if not cur.rows:
                raise ParseError(f"line {n}: section {cur.name!r} ends with no figures: {raw!r}")
            cur.took = int(m.group(2))
            state = "done"
            continue
        is_row = re.search(r"\S {2,}\S", line) is not None
        if is_row:
            if state == "notes":
                raise ParseError(f"line {n}: a row after the section's notes: {raw!r}")
            cur.rows.append(parse_row(n, line))
            state = "rows"
        else:
            if state == "header":
                cur.header.append(line)
            elif state == "rows" and cur.rows:
                # prose between rows: a row whose columns ran together
                raise ParseError(f"line {n}: prose among the rows (columns lost?): {raw!r}")
            else:
                cur.notes.append((n, line))
                state = "notes"
    if cur is None:
        raise ParseError("no '## name: command' section in the run")
    if state != "done":
        raise ParseError(f"line {len(lines)}: section {cur.name!r} has no "
                         f"'({cur.name} took N s; …)' line: the run was cut short")
    return run


# ---------------------------------------------------------------------------------------------
# What is charted. A bar names a row by its label exactly as printed (indent stripped).
# kind: "ours" (fencelock), "raw" (the raw store: round trips and floors), "peer" (another lock).
# ("parts", label, kind) splits a row such as "CPU per cycle, client / five servers  97.6 / 93.6 µs"
# into one bar per part, named by the label's own names. ("samples", label, kind) takes a p99
# the section's "samples:" note prints, e.g. "raw floor p99 2934.0 µs".

FULL_RUN = ["redis", "redis-sentinel", "redlock", "redis-scale", "etcd", "postgres", "mysql",
            "sqlite", "zookeeper"]
# Sections a run prints that no chart draws from: the several-keys bench prints one block per
# store with the same row labels in each (its figures are read in the run's text).
UNCHARTED = {"sets"}
# Stores scripts/bench.sh runs that the stored full run predates: charted when a run has their
# section, left out of every chart when it does not. Move one into FULL_RUN once the stored
# run has it.
ELECTION_STORES = ["redis", "redlock", "postgres", "mysql", "sqlite"]
ADDED = (["etcd-election", "zookeeper-election"]
         + [f"stores-election/{store}" for store in ELECTION_STORES])

# The peers' protocol: each store's bench prints ours and its peer's acquire latency
# (asking to holding) with 8 contenders on one key, each holding 1 ms and pausing 30 ms after
# each release. Runs before 2026-11-27 predate these rows: a chart made only of them is drawn
# when its section has them, left out when the section has none of them (some of them missing
# is an error, as for any row).
PEERS_PROTOCOL_PEERS = {"etcd": "etcd's lock()", "redis": "rslock",
                        "postgres": "sqlx PgAdvisoryLock",
                        "redis-sentinel": "redis:// on the master"}
# The floor a store's bench runs in the same rounds, charted after ours and the peer's.
PEERS_PROTOCOL_FLOORS = {"redis": "the durable fenced floor", "postgres": "the fenced floor",
                         "etcd": "fenced recipe floor"}
# The stores whose handoff chart shows the floor's handoff p50 too.
PEERS_HANDOFF_FLOORS = {"etcd": "fenced recipe floor"}


def peers_protocol_bars(peer, floor=None):
    sides = [("ours", "ours"), (peer, "peer")] + ([(floor, "raw")] if floor else [])
    return [(f"peers' protocol acquire {stat}: {who}", kind)
            for stat in ("p50", "mean", "p99")
            for who, kind in sides]


def peers_handoff_bars(peer, floor=None):
    bars = [(f"peers' protocol handoff {stat}: {who}", kind)
            for stat in ("p50", "mean", "p99")
            for who, kind in (("ours", "ours"), (peer, "peer"))]
    if floor:
        bars.insert(2, (f"peers' protocol handoff p50: {floor}", "raw"))
    return bars


ADDED_ROWS = {spec[0] for peer in PEERS_PROTOCOL_PEERS.values()
              for spec in peers_protocol_bars(peer)}

# Rows of a chart that a stored run may predate (a floor measured since): left out of its chart.
LATER_ROWS = {f"peers' protocol {what} {stat}: fenced recipe floor"
              for what in ("acquire", "handoff") for stat in ("p50", "mean", "p99")}

STORE_TITLES = {
    "redis": "Redis",
    "redis-sentinel": "Redis Sentinel",
    "redlock": "Redlock (5 masters)",
    "redis-scale": "Redis, 10,000 held leases",
    "etcd": "etcd",
    "postgres": "PostgreSQL",
    "mysql": "MariaDB",
    "sqlite": "SQLite",
    "zookeeper": "ZooKeeper",
}
STORE_TITLES.update({f"stores-election/{store}": STORE_TITLES[store]
                     for store in ELECTION_STORES})

# (file, title, [(section, [bar specs])])
CHARTS = [
    ("overview-cycle.svg", "Every store: lock cycle p50, ours next to the raw floor and the peer", [
        ("redis", [("raw fenced floor: EVALSHA acquire + release p50", "raw"),
                   ("ours: try_acquire + release p50", "ours"),
                   ("rslock: lock + unlock p50", "peer")]),
        ("redlock", [("rslock on five: lock + unlock p50", "peer"),
                     ("ours on five: try_acquire + release p50", "ours")]),
        ("etcd", [("fenced floor: our enqueue txn by hand + delete, kept lease p50", "raw"),
                  ("ours: try_acquire + release p50", "ours"),
                  ("peer on a kept lease: lock() + unlock() p50", "peer")]),
        ("postgres", [("raw floor: try_lock + fence upsert + unlock p50", "raw"),
                      ("ours: try_acquire + release p50", "ours"),
                      ("sqlx PgAdvisoryLock: try_acquire + release_now p50 (no fencing token)",
                       "peer")]),
        ("mysql", [("raw floor: GET_LOCK + fence upsert + RELEASE_LOCK p50", "raw"),
                   ("ours: try_acquire + release p50", "ours"),
                   ("bare GET_LOCK + RELEASE_LOCK p50 (no fence write; stands in for a peer)",
                    "peer")]),
        ("sqlite", [("raw floor: BEGIN IMMEDIATE + insert + COMMIT + delete, NORMAL (p50)", "raw"),
                    ("cycle: try_acquire + release (p50)", "ours"),
                    ("flock(2) + counter write + fdatasync + unlock (p50)", "peer")]),
        ("zookeeper", [("raw queue cycle, create and list_children pipelined p50", "raw"),
                       ("ours: try_acquire + release p50", "ours"),
                       ("Curator: acquire() + release() p50", "peer")]),
    ]),
    ("overview-handoff.svg", "Every store: handoff p50 to a waiting client, ours next to the raw floor and the peer", [
        ("redis", [("raw PUBLISH → subscriber after idle p50", "raw"),
                   ("handoff p50, 8 waiters", "ours"),
                   ("rslock handoff p50, 8 waiters", "peer")]),
        ("redlock", [("raw two-round handoff after the same idle p50", "raw"),
                     ("ours handoff p50, 8 waiters", "ours"),
                     ("rslock handoff p50, 8 waiters", "peer")]),
        ("etcd", [("raw handoff floor: delete → another client's watch event p50", "raw"),
                  ("handoff p50, 8 waiters", "ours"),
                  ("peer handoff p50, 8 waiters (lock/unlock)", "peer")]),
        ("postgres", [("fenced floor handoff p50, 8 waiters: pg_advisory_lock + unsynced upsert, "
                       "one statement", "raw"),
                      ("handoff p50, 8 waiters", "ours"),
                      ("sqlx PgAdvisoryLock handoff p50, 8 waiters (no fencing token)", "peer")]),
        ("mysql", [("raw handoff to another p50, 8 waiters (GET_LOCK + upsert)", "raw"),
                   ("ours: handoff to another p50, 8 waiters", "ours"),
                   ("raw handoff to another p50, 8 waiters (GET_LOCK alone, no fence write)",
                    "peer", "bare GET_LOCK handoff, stands in for a peer")]),
        ("sqlite", [("handoff between 2 processes, store (p50)", "ours"),
                    ("handoff between 2 processes, flock(2) + fdatasync (p50)", "peer")]),
        ("zookeeper", [("raw handoff floor: delete → another session's watch event p50", "raw"),
                       ("handoff p50, 8 waiters: ours", "ours"),
                       ("handoff p50, 8 waiters: Curator", "peer")]),
    ]),
    ("redis-cycle-p50.svg", "Redis: lock cycle and round trip p50", [
        ("redis", [("raw PING p50", "raw"),
                   ("raw SET NX PX p50 (the raw round trip)", "raw"),
                   ("raw EVALSHA compare-and-delete p50", "raw"),
                   ("raw cycle: SET NX PX + EVALSHA p50", "raw"),
                   ("SET NX PX + DEL (unsafe floor) p50", "raw"),
                   ("raw fenced floor: EVALSHA acquire + release p50", "raw"),
                   ("ours: try_acquire + release p50", "ours"),
                   ("raw durable fenced floor (tokens survive data loss) p50", "raw"),
                   ("ours: semaphore permit (of 4): try_acquire_as + release p50", "ours"),
                   ("ours: shared (reader): try_acquire_as + release p50", "ours"),
                   ("ours: a new key per cycle p50", "ours"),
                   ("rslock: lock + unlock p50", "peer"),
                   ("rslock: a new key per cycle p50", "peer")]),
    ]),
    ("redis-cycle-p99.svg", "Redis: lock cycle p99", [
        ("redis", [("raw cycle p99", "raw"),
                   ("raw fenced floor p99", "raw"),
                   ("ours: try_acquire + release p99", "ours"),
                   ("ours: semaphore permit (of 4): try_acquire_as + release p99", "ours"),
                   ("ours: shared (reader): try_acquire_as + release p99", "ours"),
                   ("ours: a new key per cycle p99", "ours"),
                   ("rslock: lock + unlock p99", "peer")]),
    ]),
    ("redis-throughput.svg", "Redis: cycles per second, 64 tasks on distinct keys (higher is better)", [
        ("redis", [("raw cycle, 64 tasks, distinct keys", "raw"),
                   ("raw fenced floor, 64 tasks, distinct keys", "raw"),
                   ("ours, 64 tasks, distinct keys", "ours"),
                   ("raw durable fenced floor, 64 tasks, distinct keys", "raw")]),
    ]),
    ("redis-cpu.svg", "Redis: CPU and server time per cycle", [
        ("redis", [("parts", "server CPU per cycle (main thread): raw / floor / durable / ours",
                    ["raw", "raw", "raw", "ours"]),
                   ("parts", "client CPU per cycle (this process): raw / floor / durable / ours",
                    ["raw", "raw", "raw", "ours"]),
                   ("parts", "server time in commands per cycle: raw / floor / durable / ours",
                    ["raw", "raw", "raw", "ours"])]),
    ]),
    ("redis-handoff.svg", "Redis: handoff p50 to another waiter", [
        ("redis", [("raw SET NX PX p50 (the raw round trip)", "raw"),
                   ("handoff p50, 8 waiters", "ours"),
                   ("raw PUBLISH → subscriber after idle p50", "raw"),
                   ("releaser may re-take (fencelock_bench) p50", "ours"),
                   ("rslock handoff p50, 8 waiters", "peer")]),
    ]),
    ("redis-handoff-p99.svg", "Redis: handoff p99 to another waiter", [
        ("redis", [("handoff p99, 8 waiters", "ours"),
                   ("rslock handoff p99, 8 waiters", "peer")]),
    ]),
    ("redlock-cycle.svg", "Redlock on five masters: lock cycle p50 and p99", [
        ("redlock", [("raw PING to all five in parallel p50", "raw"),
                     ("raw SET NX PX to all five in parallel p50 (raw RTT)", "raw"),
                     ("single node (RedisStore): try_acquire + release p50", "ours"),
                     ("rslock on five: lock + unlock p50", "peer"),
                     ("ours on five: try_acquire + release p50", "ours"),
                     ("single node cycle p99", "ours"),
                     ("rslock cycle p99", "peer"),
                     ("ours cycle p99", "ours")]),
    ]),
    ("redlock-throughput.svg", "Redlock on five masters: cycles per second, 32 tasks on distinct keys (higher is better)", [
        ("redlock", [("single node, 32 tasks, distinct keys", "ours"),
                     ("rslock, 32 tasks, distinct keys", "peer"),
                     ("durable fenced floor on five, 32 tasks, distinct keys", "raw"),
                     ("ours, 32 tasks, distinct keys", "ours")]),
    ]),
    ("redlock-cpu.svg", "Redlock on five masters: CPU per cycle", [
        ("redlock", [("parts", "rslock: CPU per cycle, client / five servers", ["peer", "peer"]),
                     ("parts", "ours: CPU per cycle, client / five servers", ["ours", "ours"]),
                     ("parts", "durable fenced floor: CPU per cycle, client / five servers", ["raw", "raw"])]),
    ]),
    ("redlock-handoff.svg", "Redlock on five masters: handoff to another waiter", [
        ("redlock", [("raw SET NX PX to all five in parallel p50 (raw RTT)", "raw"),
                     ("ours handoff p50, 8 waiters", "ours"),
                     ("raw two-round handoff after the same idle p50", "raw"),
                     ("rslock handoff p50, 8 waiters", "peer"),
                     ("ours handoff p99, 8 waiters", "ours"),
                     ("rslock handoff p99, 8 waiters", "peer")]),
    ]),
    ("held-extend.svg", "Many leases held at once: one extend while they are kept alive", [
        ("redis-scale", [("extend p50 while they are kept alive", "ours"),
                         ("extend p99 while they are kept alive", "ours")]),
        ("etcd", [("extend p50 while they are kept alive", "ours"),
                  ("extend p99 while they are kept alive", "ours")]),
        ("postgres", [("extend p50 while they are kept alive", "ours"),
                      ("extend p99 while they are kept alive", "ours")]),
        ("mysql", [("extend p50 while they are kept alive", "ours"),
                   ("extend p99 while they are kept alive", "ours")]),
        ("zookeeper", [("extend p50 while they are kept alive", "ours"),
                       ("extend p99 while they are kept alive", "ours")]),
    ]),
    ("held-memory.svg", "Many leases held at once: client memory per held lease", [
        ("redis-scale", [("client heap per held lease", "ours"),
                         ("client RSS growth per held lease", "ours")]),
        ("etcd", [("parts", "client memory per held lock: heap live / RSS growth",
                   ["ours", "ours"])]),
        ("zookeeper", [("parts", "client memory per lease: heap live / RSS growth",
                        ["ours", "ours"])]),
    ]),
    ("etcd-cycle-p50.svg", "etcd: lock cycle and round trip p50", [
        ("etcd", [("raw round trip: get p50", "raw"),
                  ("raw round trip: put p50", "raw"),
                  ("raw floor: lease grant + txn put + delete p50", "raw"),
                  ("ours: try_acquire + release p50", "ours"),
                  ("ours: semaphore permit (of 4): try_acquire_as + release p50", "ours"),
                  ("ours: shared (reader): try_acquire_as + release p50", "ours"),
                  ("peer: grant + lock() + unlock() p50", "peer"),
                  ("peer on a kept lease: lock() + unlock() p50", "peer"),
                  ("fenced floor: our enqueue txn by hand + delete, kept lease p50", "raw")]),
    ]),
    ("etcd-cycle-p99.svg", "etcd: lock cycle and round trip p99", [
        ("etcd", [("samples", "raw get p99", "raw"),
                  ("samples", "raw put p99", "raw"),
                  ("samples", "raw floor p99", "raw"),
                  ("ours: try_acquire + release p99", "ours"),
                  ("ours: semaphore permit (of 4): try_acquire_as + release p99", "ours"),
                  ("ours: shared (reader): try_acquire_as + release p99", "ours"),
                  ("peer: grant + lock() + unlock() p99", "peer")]),
    ]),
    ("etcd-throughput.svg", "etcd: cycles per second, 16 tasks on distinct keys (higher is better)", [
        ("etcd", [("raw floor, 16 tasks, distinct keys", "raw"),
                  ("ours, 16 tasks, distinct keys", "ours")]),
    ]),
    ("etcd-handoff.svg", "etcd: handoff p50 to another waiter", [
        ("etcd", [("raw round trip: get p50", "raw"),
                  ("handoff p50, 8 waiters", "ours"),
                  ("peer handoff p50, 8 waiters (lock/unlock)", "peer"),
                  ("raw handoff floor: delete → another client's watch event p50", "raw"),
                  ("quiet handoff p50, one waiter at a time: ours (a mark)", "ours"),
                  ("quiet handoff p50: lock service", "peer"),
                  ("quiet handoff p50: raw floor", "raw")]),
    ]),
    ("etcd-handoff-p99.svg", "etcd: handoff p99 to another waiter", [
        ("etcd", [("handoff p99, 8 waiters", "ours"),
                  ("peer handoff p99, 8 waiters (lock/unlock)", "peer")]),
    ]),
    ("etcd-cpu.svg", "etcd: CPU per handoff", [
        ("etcd", [("parts", "CPU per handoff, ours: client + etcd", ["ours", "ours"]),
                  ("parts", "CPU per handoff, lock service: client + etcd", ["peer", "peer"])]),
    ]),
    ("postgres-cycle-p50.svg", "PostgreSQL: lock cycle and round trip p50", [
        ("postgres", [("raw round trip (SELECT 1) p50", "raw"),
                      ("raw floor: try_lock + fence upsert + unlock p50", "raw"),
                      ("ours: try_acquire + release p50", "ours"),
                      ("sqlx PgAdvisoryLock: try_acquire + release_now p50 (no fencing token)",
                       "peer"),
                      ("ours: semaphore permit (of 4): try_acquire_as + release p50", "ours"),
                      ("ours: shared (reader): try_acquire_as + release p50", "ours"),
                      ("ours: a new key per cycle p50", "ours")]),
    ]),
    ("postgres-cycle-p99.svg", "PostgreSQL: lock cycle and round trip p99", [
        ("postgres", [("samples", "raw SELECT 1 p99", "raw"),
                      ("samples", "raw floor p99", "raw"),
                      ("ours: try_acquire + release p99", "ours"),
                      ("ours: semaphore permit (of 4): try_acquire_as + release p99", "ours"),
                      ("ours: shared (reader): try_acquire_as + release p99", "ours"),
                      ("ours: a new key per cycle p99", "ours")]),
    ]),
    ("postgres-throughput.svg", "PostgreSQL: cycles per second, 16 tasks on distinct keys (higher is better)", [
        ("postgres", [("raw floor, 16 tasks, distinct keys", "raw"),
                      ("ours, 16 tasks, distinct keys", "ours")]),
    ]),
    ("postgres-handoff.svg", "PostgreSQL: handoff p50 to another waiter", [
        ("postgres", [("raw round trip (SELECT 1) p50", "raw"),
                      ("raw fence upsert alone (durable commit) p50", "raw"),
                      ("raw handoff p50, 8 waiters (pg_advisory_lock + upsert)", "raw"),
                      ("raw handoff p50, 8 waiters (pg_advisory_lock alone, no fence write)",
                       "raw"),
                      ("fenced floor handoff p50, 8 waiters: pg_advisory_lock + unsynced upsert, "
                       "one statement", "raw"),
                      ("handoff p50, 8 waiters", "ours"),
                      ("sqlx PgAdvisoryLock handoff p50, 8 waiters (no fencing token)", "peer")]),
    ]),
    ("mysql-cycle.svg", "MariaDB: lock cycle and round trip p50 and p99", [
        ("mysql", [("raw round trip (SELECT 1) p50", "raw"),
                   ("raw floor: GET_LOCK + fence upsert + RELEASE_LOCK p50", "raw"),
                   ("bare GET_LOCK + RELEASE_LOCK p50 (no fence write; stands in for a peer)",
                    "peer"),
                   ("ours: try_acquire + release p50", "ours"),
                   ("samples", "raw SELECT 1 p99", "raw"),
                   ("samples", "raw floor p99", "raw"),
                   ("ours: try_acquire + release p99", "ours")]),
    ]),
    ("mysql-throughput.svg", "MariaDB: cycles per second, 16 tasks on distinct keys (higher is better)", [
        ("mysql", [("raw floor, 16 tasks, distinct keys", "raw"),
                   ("ours, 16 tasks, distinct keys", "ours")]),
    ]),
    ("mysql-handoff.svg", "MariaDB: handoff to another waiter", [
        ("mysql", [("raw handoff to another p50, 8 waiters (GET_LOCK alone, no fence write)",
                    "raw"),
                   ("raw handoff to another p50, 8 waiters (GET_LOCK + upsert)", "raw"),
                   ("ours: handoff to another p50, 8 waiters", "ours"),
                   ("ours: handoff to another p99, 8 waiters", "ours")]),
    ]),
    ("sqlite-cycle.svg", "SQLite, one host: lock cycle p50 and p99", [
        ("sqlite", [("one write + fdatasync (p50)", "raw"),
                    ("raw floor: BEGIN IMMEDIATE + insert + COMMIT + delete, NORMAL (p50)", "raw"),
                    ("cycle: try_acquire + release (p50)", "ours"),
                    ("flock(2) + counter write + fdatasync + unlock (p50)", "peer"),
                    ("cycle p99", "ours")]),
    ]),
    ("zookeeper-cycle.svg", "ZooKeeper: lock cycle and round trip p50 and p99", [
        ("zookeeper", [("raw round trip: get_data p50", "raw"),
                       ("raw round trip: set_data p50", "raw"),
                       ("raw floor: create ephemeral sequential + delete p50", "raw"),
                       ("raw queue cycle: create, then list_children, then delete p50", "raw"),
                       ("raw queue cycle, create and list_children pipelined p50", "raw"),
                       ("ours: try_acquire + release p50", "ours"),
                       ("Curator: acquire() + release() p50", "peer"),
                       ("samples", "raw floor p99", "raw"),
                       ("ours: try_acquire + release p99", "ours"),
                       ("Curator: acquire() + release() p99", "peer")]),
    ]),
    ("zookeeper-throughput.svg", "ZooKeeper: cycles per second, 16 tasks on distinct keys (higher is better)", [
        ("zookeeper", [("raw floor, 16 tasks, distinct parents", "raw"),
                       ("ours, 16 tasks, distinct keys", "ours")]),
    ]),
    ("zookeeper-handoff.svg", "ZooKeeper: handoff to a waiting client, ours next to Curator's InterProcessMutex", [
        ("zookeeper", [("raw handoff floor: delete → another session's watch event p50", "raw"),
                       ("handoff p50, 8 waiters: ours", "ours"),
                       ("handoff p50, 8 waiters: Curator", "peer"),
                       ("handoff p99, 8 waiters: ours", "ours"),
                       ("handoff p99, 8 waiters: Curator", "peer"),
                       ("quiet handoff p50: raw floor after the same idle", "raw"),
                       ("quiet handoff p50, one waiter parked 20 ms: ours", "ours"),
                       ("quiet handoff p50: Curator", "peer")]),
    ]),
    ("sqlite-handoff.svg", "SQLite, one host: handoff between tasks of one process and between 2 processes", [
        ("sqlite", [("handoff between 2 tasks of one process (p50)", "ours"),
                    ("handoff among 8 tasks of one process (p50)", "ours"),
                    ("handoff between 2 processes, store (p50)", "ours"),
                    ("handoff between 2 processes, flock(2) + fdatasync (p50)", "peer"),
                    ("handoff between 2 tasks of one process (p99)", "ours"),
                    ("handoff between 2 processes, store (p99)", "ours"),
                    ("handoff between 2 processes, flock(2) (p99)", "peer")]),
    ]),
]

CHARTS += [
    (f"{store}-peers-protocol.svg",
     f"{STORE_TITLES[store]}: acquire latency in the peers' protocol, ours next to {peer}",
     [(store, peers_protocol_bars(peer, PEERS_PROTOCOL_FLOORS.get(store)))])
    for store, peer in PEERS_PROTOCOL_PEERS.items()
] + [
    (f"{store}-peers-protocol-handoff.svg",
     f"{STORE_TITLES[store]}: release-to-grant handoff in the peers' protocol, ours next to "
     f"{PEERS_PROTOCOL_PEERS[store]}",
     [(store, peers_handoff_bars(PEERS_PROTOCOL_PEERS[store], PEERS_HANDOFF_FLOORS.get(store)))])
    for store in ("etcd", "postgres")
] + [
    ("redis-sentinel-cycle.svg", "Redis Sentinel: lock cycle p50 and p99, next to redis:// on its master", [
        ("redis-sentinel", [("raw PING to the master p50 (the raw round trip)", "raw"),
                            ("redis:// on the master: acquire + release p50", "peer"),
                            ("redis+sentinel://: acquire + release p50", "ours"),
                            ("redis+sentinel:// with min_replicas=1: acquire + release p50",
                             "ours"),
                            ("redis:// on the master: acquire + release p99", "peer"),
                            ("redis+sentinel://: acquire + release p99", "ours"),
                            ("redis+sentinel:// with min_replicas=1: acquire + release p99",
                             "ours")]),
    ]),
]

# Target lines: in chart FILE, across the bars of SECTION whose label contains SPAN (every bar
# when None), a dashed line at FACTOR times the figure of the bar labelled BASE, named TEXT.
TARGET_LINES = {
    ("overview-cycle.svg", "etcd"): ("peer on a kept lease: lock() + unlock() p50", 1.0,
                                     "target ≤ 1.0× lock() + unlock()", None),
    ("overview-cycle.svg", "postgres"): ("raw floor: try_lock + fence upsert + unlock p50", 1.2,
                                         "target ≤ 1.2× raw floor", None),
    ("overview-cycle.svg", "mysql"): ("raw floor: GET_LOCK + fence upsert + RELEASE_LOCK p50",
                                      1.2, "target ≤ 1.2× raw floor", None),
    ("overview-cycle.svg", "zookeeper"): ("raw queue cycle, create and list_children pipelined "
                                          "p50", 1.05, "target ≤ 1.05× pipelined queue cycle",
                                          None),
    ("overview-handoff.svg", "etcd"): ("peer handoff p50, 8 waiters (lock/unlock)", 1.0,
                                       "target ≤ 1.0× lock()", None),
    ("overview-handoff.svg", "postgres"): ("fenced floor handoff p50, 8 waiters: pg_advisory_lock "
                                           "+ unsynced upsert, one statement", 1.1,
                                           "target ≤ 1.1× fenced floor", None),
    ("overview-handoff.svg", "mysql"): ("raw handoff to another p50, 8 waiters (GET_LOCK + "
                                        "upsert)", 1.1, "target ≤ 1.1× raw handoff", None),
    ("overview-handoff.svg", "zookeeper"): ("handoff p50, 8 waiters: Curator", 1.0,
                                            "target ≤ 1.0× Curator", None),
    ("postgres-peers-protocol.svg", "postgres"): ("peers' protocol acquire p50: the fenced floor",
                                                  1.1, "target ≤ 1.1× the fenced floor", "p50"),
    ("etcd-peers-protocol-handoff.svg", "etcd"): ("peers' protocol handoff p50: etcd's lock()",
                                                  1.0, "target ≤ 1.0× lock()", "p50"),
}




# Leader election: ours next to the peer's recipe on the same server, in alternating rounds
# (etcd's election service, Curator's LeaderSelector); the stores with no peer on their own.
def pairs(stem, stats, ours, peer, kinds=("ours", "peer")):
    """Rows 'STEM STAT: OURS' and 'STEM STAT: PEER' for each stat, ours first."""
    return [(f"{stem} {stat}: {who}", kind)
            for stat in stats for who, kind in ((ours, kinds[0]), (peer, kinds[1]))]


P50_MEAN_P99 = ("p50", "mean", "p99")
P50_MEAN_MAX = ("p50", "mean", "max")
ETCD_PEER = "etcd's election service"
CURATOR = "Curator's LeaderSelector"

CHARTS += [
    ("etcd-election-handover.svg",
     "etcd: election handover, resign sent → the next candidate leads, ours next to etcd's "
     "election service",
     [("etcd-election",
       pairs("handover, resign sent → candidate's campaign returns", P50_MEAN_P99, "ours",
             ETCD_PEER)
       + pairs("handover to a successor known at the grant (a handoff mark)", P50_MEAN_P99,
               "ours", ETCD_PEER))]),
    ("etcd-election-observe.svg",
     "etcd: observe, resign sent → the observer names the new leader, ours next to etcd's "
     "election service",
     [("etcd-election",
       pairs("observe, resign sent → observer names the new leader", P50_MEAN_P99, "ours",
             ETCD_PEER)
       + pairs("observe, that handover", P50_MEAN_P99, "ours", ETCD_PEER)
       + [("after the wake-up, ours: a status read p50", "ours"),
          ("after the wake-up, theirs: Leader() p50", "peer"),
          ("raw floor: delete → another client's watch event p50", "raw")])]),
    ("etcd-election-failover.svg",
     "etcd: failover, the leader SIGKILLed → the next candidate leads (TTL 2 s), ours next to "
     "etcd's election service",
     [("etcd-election",
       [(f"failover, kill → candidate's campaign returns (ratio: / TTL) {stat}: {who}", kind)
        for who, kind in (("ours", "ours"), (ETCD_PEER, "peer"))
        for stat in P50_MEAN_MAX])]),
    ("zookeeper-election-handover.svg",
     "ZooKeeper: election handover, resign sent → the next candidate leads, ours next to "
     "Curator's LeaderSelector",
     [("zookeeper-election",
       pairs("handover, resign sent → candidate leads", P50_MEAN_P99, "ours", CURATOR))]),
    ("zookeeper-election-observe.svg",
     "ZooKeeper: observe, resign sent → the observer names the new leader, ours next to "
     "Curator's CuratorCache",
     [("zookeeper-election",
       pairs("observe, resign sent → observer names the new leader", P50_MEAN_P99, "ours",
             "Curator: CuratorCache")
       + [("naming the leader, ours: a status read p50", "ours"),
          ("naming the leader, Curator: getLeader() p50", "peer"),
          ("raw floor: delete → another session's watch event, after 50 ms idle p50",
           "raw")])]),
    ("zookeeper-election-failover.svg",
     "ZooKeeper: failover, the leader SIGKILLed → the next candidate leads (session timeout "
     "2 s), ours next to Curator's LeaderSelector",
     [("zookeeper-election",
       [(f"failover, kill → candidate leads (ratio: / session timeout) {stat}: {who}", kind)
        for who, kind in (("ours", "ours"), (CURATOR, "peer"))
        for stat in P50_MEAN_MAX]
       + [("failover max (ratio: / that bound): ours", "ours"),
          (f"failover max (ratio: / that bound): {CURATOR}", "peer")])]),
    ("stores-election-handover.svg",
     "Redis, Redlock, PostgreSQL, MariaDB, SQLite: election handover, resign sent → a "
     "candidate leads (no peer)",
     [(f"stores-election/{store}",
       [(f"handover, resign sent → a candidate's campaign returns {stat}", "ours")
        for stat in P50_MEAN_P99])
      for store in ELECTION_STORES]),
    ("stores-election-observe.svg",
     "Redis, Redlock, PostgreSQL, MariaDB, SQLite: observe, resign sent → the observer "
     "names the new leader (polled every 100 ms; no peer)",
     [(f"stores-election/{store}",
       [(f"observe, resign sent → observer names the new leader {stat}", "ours")
        for stat in P50_MEAN_P99])
      for store in ELECTION_STORES]),
    ("stores-election-failover.svg",
     "Redis, Redlock, PostgreSQL, MariaDB, SQLite: failover, the leader SIGKILLed → a "
     "candidate leads (TTL 2 s; no peer)",
     [(f"stores-election/{store}",
       [(f"failover, kill → candidate's campaign returns (ratio: / TTL) {stat}: ours", "ours")
        for stat in P50_MEAN_MAX]
       + [("failover max (ratio: / that bound)", "ours")])
      for store in ELECTION_STORES]),
]


class Bar:
    def __init__(self, label, text, number, unit, kind, note, lineno, target=""):
        self.target = target or ""  # "target …: met", or ""
        self.label = label  # the row's label as printed (a part: "label: part")
        self.text = text  # the figure as printed, with its unit
        self.number = number
        self.unit = unit
        self.kind = kind
        self.note = note  # "1.12× · target …: met", or ""
        self.lineno = lineno
        self.row_label = label  # the row's own label: what a target line's base names


# Rows whose label a later run spells differently: the chart names the later one, and a
# stored run's label is read as it.
RENAMED_ROWS = {
    # the harness moved from fencelock_conformance::bench to the fencelock_bench crate
    "releaser may re-take (fencelock_conformance::bench) p50":
        "releaser may re-take (fencelock_bench) p50",
}


def find_row(section, label):
    found = [r for r in section.rows if RENAMED_ROWS.get(r.label, r.label) == label]
    if len(found) != 1:
        what = "no row" if not found else f"{len(found)} rows"
        raise ParseError(f"section {section.name!r} (line {section.lineno}): {what} labelled "
                         f"{label!r}; the charts need exactly one")
    return found[0]


def row_bar(section, label, kind, shown=None):
    """The bar of the row labelled `label`, drawn as the row's label followed by `shown`
    after a dash, where given."""
    row = find_row(section, label)
    if row.number is None:
        raise ParseError(f"line {row.lineno}: {label!r}: the value {row.value!r} is not one "
                         f"number with a unit")
    note = SEP.join(x for x in (row.ratio, row.target) if x)
    text = f"{row.label} — {shown}" if shown else row.label
    bar = Bar(text, row.value, row.number, row.unit, kind, note, row.lineno, row.target)
    bar.row_label = row.label
    return [bar]


def parts_bars(section, label, kinds):
    row = find_row(section, label)
    head, sep, names = row.label.rpartition(": ")
    if not sep or row.value is None:
        raise ParseError(f"line {row.lineno}: {label!r} does not read 'what: a / b …'")
    joiner = " / " if " / " in names else " + "
    names = names.split(joiner)
    values = row.value.split(joiner)
    if len(names) != len(values) or len(names) != len(kinds):
        raise ParseError(f"line {row.lineno}: {label!r}: {len(names)} names, {len(values)} "
                         f"values, {len(kinds)} kinds: {row.value!r}")
    parsed = []
    for v in values:
        m = NUMBER_UNIT.fullmatch(v.strip())
        if not m:
            raise ParseError(f"line {row.lineno}: {label!r}: {v!r} is not a number")
        parsed.append([m.group(1), m.group(2)])
    unit = parsed[-1][1]
    if not unit:
        raise ParseError(f"line {row.lineno}: {label!r}: no unit in {row.value!r}")
    bars = []
    for (num, u), name, kind in zip(parsed, names, kinds):
        if u and u != unit:
            raise ParseError(f"line {row.lineno}: {label!r}: mixed units in {row.value!r}")
        bars.append(Bar(f"{head}: {name}", f"{num} {unit}", float(num), unit, kind,
                        "", row.lineno))
    return bars


def samples_bar(section, label, kind):
    found = []
    for n, note in section.notes:
        if note.startswith("samples:"):
            for m in SAMPLES_P99.finditer(note):
                if f"{m.group(1)} p99" == label:
                    found.append((n, m.group(2)))
    if len(found) != 1:
        raise ParseError(f"section {section.name!r} (line {section.lineno}): its 'samples:' "
                         f"line has {len(found)} figures '{label} N µs'; the charts need one")
    n, num = found[0]
    return [Bar(f"{label} (from the samples line)", f"{num} µs", float(num), "µs", kind, "", n)]


def build(run, spec_groups):
    groups = []
    for name, specs in spec_groups:
        section = run.section(name)
        # a stored full run predates the section; one bench's output has only its own
        if section is None and (name in ADDED or run.bench is not None):
            continue
        if (all(spec[0] in ADDED_ROWS for spec in specs)
                and not any(r.label in ADDED_ROWS for r in section.rows)):
            continue
        bars = []
        for spec in specs:
            if spec[0] == "parts":
                bars += parts_bars(section, spec[1], spec[2])
            elif spec[0] == "samples":
                bars += samples_bar(section, spec[1], spec[2])
            elif spec[0] in LATER_ROWS and not any(r.label == spec[0] for r in section.rows):
                continue
            else:
                bars += row_bar(section, *spec)
        groups.append((section, bars))
    return groups


# ---------------------------------------------------------------------------------------------
# Drawing

COLORS = {"ours": "#1f6feb", "raw": "#8c959f", "peer": "#d4690e"}
LEGEND = [("ours", "ours (fencelock)"), ("raw", "raw store: round trip or floor"),
          ("peer", "peer lock")]
INK = "#1f2328"
MUTED = "#57606a"
# SVG collapses runs of spaces, and renderers differ on spaces at a tspan's edge: the gaps
# before a bar's note and its line number are a tspan's dx, never spaces
SEP = " · "
CHAR_W = 6.9  # a generous average width of a 12px sans-serif character
FOOT_W = 6.2  # of an 11px one


def esc(s):
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def f1(x):
    s = f"{x:.1f}"
    return "0.0" if s == "-0.0" else s


def nice_step(top):
    raw = top / 5.0
    mag = 1.0
    while mag * 10 <= raw:
        mag *= 10
    while mag > raw:
        mag /= 10
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def fmt_tick(v, step):
    if step >= 1 and float(int(step)) == step:
        return f"{int(round(v))}"
    return f"{v:.1f}"


def wrap(text, width):
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out


def higher_is_better(unit):
    return unit == "/s"


def target_lines(fname, groups):
    """{id(section): (value, text, span)} of the chart's target lines (TARGET_LINES), each at
    its factor times its base bar's figure."""
    lines = {}
    for section, bars in groups:
        spec = TARGET_LINES.get((fname, section.name))
        if spec is None:
            continue
        base, factor, text, span = spec
        found = [b for b in bars if b.row_label == base]
        if len(found) != 1:
            raise ParseError(f"{fname}: the target line of {section.name!r} is drawn from the bar "
                             f"{base!r}, which the chart must have once ({len(found)} found)")
        lines[id(section)] = (found[0].number * factor, f"{text} ({found[0].text} × {factor})",
                              span)
    return lines


def draw(run, run_name, fname, title, groups):
    units = sorted({b.unit for _, bars in groups for b in bars})
    if len(units) != 1:
        raise ParseError(f"{fname}: its bars have different units {units}; one chart, one unit")
    unit = units[0]
    single = len(groups) == 1
    section0 = groups[0][0]
    commands = {section.command for section, _ in groups}
    if run.bench is not None and len(commands) == 1:
        subtitle = [f"{section0.command}  ({run_name}"
                    + (")" if single else ", one store after another, each named above its "
                       "bars)")]
    elif single:
        subtitle = [f"{section0.command}  (section '{section0.name}' of {run_name})"]
    else:
        subtitle = [f"scripts/bench.sh, one command per store, each named above its bars "
                    f"({run_name})"]
    subtitle.append(f"run of {run.stamp}; "
                    + ("higher is better" if higher_is_better(unit) else "lower is better")
                    + "; every figure as the run printed it")
    if not single:
        # each store's ratios compare to a different base: here only the targets, which say
        # what they compare to
        for _, bars in groups:
            for b in bars:
                b.note = b.target
    foot = [f"(line N): the line of {run_name} the figure is on."]
    if any(b.note for _, bars in groups for b in bars):
        if single:
            foot.append("×: the run's ratio column, as printed; the section's 'ratios:' line "
                        "(below, where the run has one) or the target beside it says what it "
                        "compares to.")
        else:
            foot.append("Targets as the run printed them; the ratio column is left out here, "
                        "since each store's compares to a different base (see that store's "
                        "charts).")
    if single:
        for line in section0.header:
            foot.append(f"{section0.name}: {line}")
        for _, line in section0.notes:
            # a lenient section's notes are its prose after the figures, all of it
            if (line.startswith("ratios:") or line.startswith("samples:")
                    or section0.name in LENIENT):
                foot.append(f"{section0.name}: {line}")
    # one "from line N" per bar keeps every figure traceable to the run's text
    label_lines = []
    for section, bars in groups:
        for b in bars:
            extra = f"{SEP}{b.note}" if b.note else ""
            label_lines.append(f"{b.label}{extra}   (line {b.lineno})")
    longest = max([len(s) for s in label_lines] + [len(title) * 1.25]
                  + [len(s) * 0.95 for s in subtitle])
    width = max(900, int(40 + longest * CHAR_W + 0.5))
    foot_lines = []
    for f in foot:
        foot_lines += wrap(f, int((width - 40) / FOOT_W))

    left, right_pad = 20, 120
    bar_w_max = width - left - right_pad
    lines = target_lines(fname, groups)
    top = max([b.number for _, bars in groups for b in bars]
              + [value for value, _, _ in lines.values()])
    step = nice_step(top) if top > 0 else 1.0
    axis_max = step
    while axis_max < top:
        axis_max += step
    scale = bar_w_max / axis_max

    out = []
    y = 0
    body = []
    # title block
    y += 28
    body.append(f'<text x="{left}" y="{y}" font-size="16" font-weight="bold" fill="{INK}">'
                f'{esc(title)}</text>')
    for s in subtitle:
        y += 18
        body.append(f'<text x="{left}" y="{y}" font-size="12" fill="{MUTED}">{esc(s)}</text>')
    # legend
    y += 24
    x = left
    kinds_used = {b.kind for _, bars in groups for b in bars}
    election = any(section.name.split("/")[0] in LENIENT for section, _ in groups)
    for kind, text in LEGEND:
        if kind not in kinds_used:
            continue
        if kind == "peer" and election:
            text = "peer election recipe"
        body.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" '
                    f'fill="{COLORS[kind]}"/>')
        body.append(f'<text x="{x + 17}" y="{y}" font-size="12" fill="{INK}">{esc(text)}</text>')
        x += 17 + int(len(text) * CHAR_W + 0.5) + 22
    y += 10
    chart_top = y
    rows = []
    marks = []
    for section, bars in groups:
        spans = []
        if not single:
            y += 26
            rows.append(f'<text x="{left}" y="{y}" font-size="13" font-weight="bold" '
                        f'fill="{INK}">{esc(STORE_TITLES.get(section.name, section.name))}: '
                        f'{esc(section.where or section.command)}</text>')
        for b in bars:
            y += 22
            label = esc(b.label)
            extra = ""
            if b.note:
                extra = f'<tspan dx="6" fill="{MUTED}">· {esc(b.note)}</tspan>'
            rows.append(f'<text x="{left}" y="{y}" font-size="12" fill="{INK}">{label}{extra}'
                        f'<tspan dx="8" fill="{MUTED}">(line {b.lineno})</tspan></text>')
            y += 5
            w = b.number * scale
            rows.append(f'<rect x="{left}" y="{y}" width="{f1(max(w, 0.0))}" height="14" '
                        f'fill="{COLORS[b.kind]}"><title>{esc(b.label)}: {esc(b.text)}</title>'
                        f'</rect>')
            rows.append(f'<text x="{f1(left + max(w, 0.0) + 6)}" y="{y + 11}" font-size="12" '
                        f'font-weight="bold" fill="{INK}">{esc(b.text)}</text>')
            line = lines.get(id(section))
            if line is not None and (line[2] is None or line[2] in b.row_label):
                spans.append(y)
            y += 14
        if spans:
            value, text, _ = lines[id(section)]
            x = f1(left + value * scale)
            marks.append(f'<line x1="{x}" y1="{spans[0] - 4}" x2="{x}" y2="{spans[-1] + 18}" '
                         f'stroke="{INK}" stroke-width="1.5" stroke-dasharray="4 3">'
                         f'<title>{esc(text)}</title></line>')
            marks.append(f'<text x="{x}" y="{spans[-1] + 28}" font-size="11" '
                         f'text-anchor="middle" fill="{INK}">{esc(text)}</text>')
            y += 12
    chart_bottom = y + 6
    # grid and axis under the bars
    grid = []
    v = 0.0
    while v <= axis_max + step / 1000:
        gx = left + v * scale
        grid.append(f'<line x1="{f1(gx)}" y1="{chart_top}" x2="{f1(gx)}" y2="{chart_bottom}" '
                    f'stroke="#d0d7de" stroke-width="1"/>')
        grid.append(f'<text x="{f1(gx)}" y="{chart_bottom + 14}" font-size="11" '
                    f'text-anchor="middle" fill="{MUTED}">{fmt_tick(v, step)}</text>')
        v += step
    y = chart_bottom + 32
    grid.append(f'<text x="{f1(left + bar_w_max / 2)}" y="{y}" font-size="12" '
                f'text-anchor="middle" fill="{MUTED}">{esc(unit)}</text>')
    for line in foot_lines:
        y += 16
        rows.append(f'<text x="{left}" y="{y}" font-size="11" fill="{MUTED}">{esc(line)}</text>')
    height = y + 16
    out.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}" font-family="sans-serif">')
    out.append(f'<title>{esc(title)}</title>')
    out.append(f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>')
    out += body + grid + rows + marks
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render(run_path):
    """{file name: bytes} for the run at run_path."""
    with open(run_path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParseError(f"{run_path}: not UTF-8 ({e})")
    run = parse(text)
    charted = {name for _, _, spec_groups in CHARTS for name, _ in spec_groups}
    for s in run.sections:
        if s.name not in charted and s.name not in UNCHARTED:
            raise ParseError(f"line {s.lineno}: no charts for section {s.name!r}; add them to "
                             f"CHARTS in scripts/bench_charts.py: {s.where or s.command}")
    missing = [n for n in FULL_RUN if run.section(n) is None]
    if missing and run.bench is None:
        raise ParseError(f"not a full run: no section for {', '.join(missing)} "
                         f"(scripts/bench.sh with no arguments runs them all)")
    run_name = os.path.basename(run_path)
    files = {}
    for fname, title, spec_groups in CHARTS:
        groups = build(run, spec_groups)
        if groups:
            files[fname] = draw(run, run_name, fname, title, groups).encode("utf-8")
    return files


def write(files, outdir):
    os.makedirs(outdir, exist_ok=True)
    for name in sorted(files):
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(files[name])
    for name in sorted(os.listdir(outdir)):
        if name.endswith(".svg") and name not in files:
            os.remove(os.path.join(outdir, name))
            print(f"removed {os.path.join(outdir, name)}: no longer generated")


def main(argv):
    check = False
    args = argv[1:]
    if args and args[0] == "--check":
        check = True
        args = args[1:]
    if len(args) != 2:
        print("usage: bench_charts.py [--check] RUN.txt OUTDIR", file=sys.stderr)
        return 2
    run_path, outdir = args
    try:
        files = render(run_path)
    except (ParseError, OSError) as e:
        print(f"bench_charts.py: {run_path}: {e}", file=sys.stderr)
        return 2
    if not check:
        write(files, outdir)
        print(f"wrote {len(files)} charts to {outdir}")
        return 0
    tmp = tempfile.mkdtemp(prefix="bench-charts-")
    try:
        write(files, tmp)
        want = set(os.listdir(tmp))
        have = set(os.listdir(outdir)) if os.path.isdir(outdir) else set()
        bad = []
        for name in sorted(want | have):
            if name not in have:
                bad.append(f"missing: {os.path.join(outdir, name)}")
            elif name not in want:
                bad.append(f"extra: {os.path.join(outdir, name)} (not generated from {run_path})")
            else:
                with open(os.path.join(outdir, name), "rb") as f:
                    if f.read() != files[name]:
                        bad.append(f"differs: {os.path.join(outdir, name)}")
    finally:
        shutil.rmtree(tmp)
    if bad:
        for line in bad:
            print(line, file=sys.stderr)
        print(f"charts in {outdir} are not what {run_path} gives; regenerate with: "
              f"python3 scripts/bench_charts.py {run_path} {outdir}", file=sys.stderr)
        return 1
    print(f"{len(files)} charts in {outdir} match {run_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
