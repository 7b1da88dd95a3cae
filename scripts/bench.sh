#!/usr/bin/env bash
# Every store's benchmark, one after another in one run (release builds), each printing its
# figures next to the raw store's own round trip measured in the same run. The README's
# benchmark table is written from one such run. Not part of scripts/test.sh: run it on an
# otherwise idle machine (it takes a few minutes per store).
#
#   scripts/bench.sh            every bench; the output is also kept in target/bench/
#   scripts/bench.sh redis etcd only those (names below)
#   scripts/bench.sh --build redis-cycle-cost   only build it, into target/bench/bin/
#   scripts/bench.sh --targets RUN.txt          a stored run's targets, met or MISSED
set -euo pipefail
cd "$(dirname "$0")/.."

# The bench targets of fencelock-bench (bench/benches/), in the order they run. The callgrind
# ones (redis-cycle-cost, postgres-cycle-cost, etcd-handoff-cost) are built with --build and run by hand.
benches=(
  redis
  redis-sentinel
  redlock
  redis-scale
  etcd
  etcd-election
  postgres
  mysql
  sqlite
  zookeeper
  zookeeper-election
  stores-election
  sets
)

# Every target a run printed, met or MISSED, under its bench's name, with the rows of the
# floors measured in the same run ("floor" in their label) beside them.
targets() {
  python3 - "$1" <<'PY'
import re, sys
section, floors, out = None, [], []
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.rstrip("\n")
    m = re.match(r"## (\S+): ", line)
    if m:
        section = m.group(1)
        out.append(f"\n{section}")
        continue
    if section is None or not line.strip():
        continue
    m = re.search(r"target (.*): (met|MISSED)$", line)
    label = re.split(r"\s{2,}", line.strip())[0]
    if m:
        out.append(f"  {m.group(2):6}  {label}: {m.group(1)}")
    elif "floor" in label and not label.startswith("samples:") and re.search(r"\d", line):
        out.append(f"          {re.sub(r'  +', '  ', line.strip())}")
print("targets, met or MISSED, with the floors each run measured:" + "\n".join(out))
PY
}

# scripts/bench.sh --targets RUN.txt: the targets of a stored run, and stop.
if [[ ${1:-} == --targets ]]; then
  targets "$2"
  exit 0
fi

# scripts/bench.sh --build NAME…: build those benches into target/bench/bin/NAME and stop.
build_only=
if [[ ${1:-} == --build ]]; then
  build_only=1
  shift
fi

selected=("$@")
wanted() {
  ((${#selected[@]} == 0)) && return 0
  local name
  for name in "${selected[@]}"; do
    [[ $name == "$1" ]] && return 0
  done
  return 1
}

# Build every selected bench first, so that no build runs next to a measurement, and copy
# each one out under its name (cargo names a bench's binary with a hash).
mkdir -p target/bench/bin
build() {
  local name=$1 executable
  executable=$(cargo bench -q --no-run -p fencelock-bench --bench "$name" --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')
  cp "$executable" "target/bench/bin/$name"
}
if [[ -n $build_only ]]; then
  for name in "$@"; do
    build "$name"
    echo "target/bench/bin/$name"
  done
  exit 0
fi
for name in "${benches[@]}"; do
  wanted "$name" || continue
  build "$name"
done

mkdir -p target/bench
log="target/bench/$(date -u +%Y-%m-%dT%H%M%SZ).txt"
{
  echo "# scripts/bench.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for name in "${benches[@]}"; do
    wanted "$name" || continue
    echo
    echo "## $name: cargo bench -p fencelock-bench --bench $name"
    start=$SECONDS
    "target/bench/bin/$name"
    echo "($name took $((SECONDS - start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg))"
  done
} 2>&1 | tee "$log"
echo
targets "$log"
echo "kept in $log (its targets again: scripts/bench.sh --targets $log)"
