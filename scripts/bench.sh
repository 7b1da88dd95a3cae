#!/usr/bin/env bash
# Every store's benchmark, one after another in one run (release builds), each printing its
# figures next to the raw store's own round trip measured in the same run. The README's
# benchmark table is written from one such run. Not part of scripts/test.sh: run it on an
# otherwise idle machine (it takes a few minutes per store).
#
#   scripts/bench.sh            every bench; the output is also kept in target/bench/
#   scripts/bench.sh redis etcd only those (names below)
set -euo pipefail
cd "$(dirname "$0")/.."

# name, package, example[, the features it needs]
benches=(
  "redis fencelock-redis bench"
  "redlock fencelock-redis redlock_bench"
  "redis-scale fencelock-redis scale"
  "etcd fencelock-etcd bench"
  "etcd-election fencelock-etcd election_bench"
  "postgres fencelock-postgres bench"
  "mysql fencelock-mysql bench"
  "sqlite fencelock-sqlite bench"
  "zookeeper fencelock-zookeeper bench"
  "zookeeper-election fencelock-zookeeper election_bench"
  "stores-election fencelock election_bench redis,postgres,mysql,sqlite"
)

selected=("$@")
wanted() {
  ((${#selected[@]} == 0)) && return 0
  local name
  for name in "${selected[@]}"; do
    [[ $name == "$1" ]] && return 0
  done
  return 1
}

# Build every selected example first, so that no build runs next to a measurement, and copy
# each one out at once: several crates have an example called `bench`, and they share
# target/release/examples/bench.
mkdir -p target/bench/bin
for entry in "${benches[@]}"; do
  read -r name package example features <<<"$entry"
  wanted "$name" || continue
  cargo build -q --release -p "$package" --example "$example" ${features:+--features "$features"}
  cp "${CARGO_TARGET_DIR:-target}/release/examples/$example" "target/bench/bin/$name"
done

mkdir -p target/bench
log="target/bench/$(date -u +%Y-%m-%dT%H%M%SZ).txt"
{
  echo "# scripts/bench.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for entry in "${benches[@]}"; do
    read -r name package example features <<<"$entry"
    wanted "$name" || continue
    echo
    echo "## $name: cargo run --release -p $package ${features:+--features $features }--example $example"
    start=$SECONDS
    "target/bench/bin/$name"
    echo "($name took $((SECONDS - start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg))"
  done
} 2>&1 | tee "$log"
echo "kept in $log"
