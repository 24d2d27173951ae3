#!/usr/bin/env bash
# Runs the worker package's 16-fetcher concurrency test
# (TestSixteenWorkersAtTheFixCompleteEveryItemExactlyOnce) RUNS times (default
# 200) against one throwaway PostgreSQL started here with lock-wait logging:
# log_lock_waits = on and deadlock_timeout = 1ms, so the server logs every
# lock wait longer than 1 ms with the waiting statement, its PL/pgSQL line and
# the holder's pid; log_statement = all (LOG_STATEMENT=none to leave it out)
# names the holder's statement. Prints, per run, the test's verdict, its
# sampler's line and every logged wait; at the end the totals.
#   scripts/worker-lock-waits.sh [RUNS]
# Environment: PG_BIN (server binaries; default: the newest under
# /usr/lib/postgresql), OUT (default out), DEADLINE (stop starting runs after
# this time, anything `date -d` reads, e.g. 19:15), TEST (-test.run pattern).
# Exit status 0 when every run passed and no fetch_work_item waited.
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-200}"
case "$runs" in '' | *[!0-9]*) echo "usage: $0 [RUNS]" >&2; exit 2 ;; esac
out="${OUT:-out}/worker-lock-waits"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
[ -x "$bin/postgres" ] || { echo "no PostgreSQL server binaries (set PG_BIN)" >&2; exit 2; }
deadline=""
if [ -n "${DEADLINE:-}" ]; then deadline="$(date -d "$DEADLINE" +%s)" || exit 2; fi
test_re="${TEST:-^TestSixteenWorkersAtTheFixCompleteEveryItemExactlyOnce$}"

go test -c -o "$out/worker.test" ./internal/sim/worker/ || exit 2

dir="$(mktemp -d /tmp/worker-lock-waits.XXXXXX)"
as=()
if [ "$(id -u)" = 0 ]; then
  user=postgres; id postgres >/dev/null 2>&1 || user=nobody
  chown "$user" "$dir"
  as=(runuser -u "$user" --)
fi
pglog="$dir/server.log"
"${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
  { cat "$dir/initdb.log" >&2; exit 2; }
port="$(( 20000 + RANDOM % 20000 ))"
"${as[@]}" "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" \
  -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
  -c max_connections=300 -c shared_buffers=128MB -c max_locks_per_transaction=256 \
  -c log_lock_waits=on -c deadlock_timeout=1ms -c lc_messages=C \
  -c "log_line_prefix=%m [%p] " -c "log_statement=${LOG_STATEMENT:-all}" \
  >"$pglog" 2>&1 &
pgpid=$!
cleanup() {
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" stop -m fast -w >/dev/null 2>&1
  wait "$pgpid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
# (npm's server packages ship no pg_isready: wait for the log's line.)
for _ in $(seq 1 300); do
  grep -q 'ready to accept connections' "$pglog" && break
  kill -0 "$pgpid" 2>/dev/null || break
  sleep 0.1
done
grep -q 'ready to accept connections' "$pglog" || { cat "$pglog" >&2; exit 2; }
version="$("$bin/postgres" --version)"
echo "server: $version, log_lock_waits=on deadlock_timeout=1ms log_statement=${LOG_STATEMENT:-all}; logs under $out"

# waits FILE RUN prints every lock wait the server logged in FILE: the
# waiter's statement (the function it calls), the lock, the PL/pgSQL context,
# the holder and the holder's last logged statement, and how long it waited.
waits() {
  awk -v run="$2" '
    function fn(s,   m) {
      if (match(s, /\.[a-z_]+\(/)) return substr(s, RSTART + 1, RLENGTH - 2)
      if (s ~ /worker_queue WHERE lock_token/) return "read lease"
      return substr(s, 1, 100)
    }
    function done(p) {
      if (!(p in wmsg)) return
      # A fetch waiting on a row (a transaction or a tuple lock) is the
      # defect; waits on a relation extension lock are not (locks.go).
      kind = (wstmt[p] ~ /fetch_work_item/ && wmsg[p] !~ / on extension of /) ? "FETCH-WAIT" : "other-wait"
      printf "run %s %s: [%s] %s: %s%s\n", run, kind, p, fn(wstmt[p]), wmsg[p], (p in wacq) ? "; " wacq[p] : ""
      printf "    detail: %s\n", wdet[p]
      printf "    context: %s\n", wctx[p]
      printf "    holder: %s\n", whold[p]
      delete wmsg[p]; delete wacq[p]; delete wdet[p]; delete wctx[p]; delete whold[p]; delete wstmt[p]
    }
    function entry(e, p,   sev, text, h, hs, n, i) {
      if (e == "") return
      sev = e; sub(/^[^]]*\] /, "", sev); text = sev; sub(/:.*/, "", sev); sub(/^[A-Z]+:  /, "", text)
      gsub(/\n\t/, " | ", text)
      if (sev == "LOG" && text ~ /^(statement|execute [^:]*): /) { last[p] = text; return }
      if (sev == "LOG" && text ~ /still waiting for/) { done(p); wmsg[p] = text; wstmt[p] = last[p]; return }
      if (sev == "LOG" && text ~ /acquired .* after/) {
        if (p in wmsg) { wacq[p] = text; done(p) } else print "run " run " (late): [" p "] " text
        return
      }
      if (!(p in wmsg)) return
      if (sev == "DETAIL") {
        wdet[p] = text
        if (match(text, /holding the lock: [0-9, ]+/)) {
          hs = substr(text, RSTART + 18, RLENGTH - 18); n = split(hs, h, /, */)
          for (i = 1; i <= n; i++) if (h[i] != "") whold[p] = whold[p] "[" h[i] "] " ((h[i] in last) ? substr(last[h[i]], 1, 220) : "?") "  "
        }
      } else if (sev == "CONTEXT") wctx[p] = text
      else if (sev == "STATEMENT") wstmt[p] = text
    }
    /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] / {
      entry(cur, curpid)
      cur = $0; curpid = $0; sub(/^[^[]*\[/, "", curpid); sub(/\].*/, "", curpid)
      next
    }
    { cur = cur "\n" $0 }
    END { entry(cur, curpid); for (p in wmsg) done(p) }
  ' "$1"
}

pass=0 ran=0 fetch_waits=0 other_waits=0 sampled=0
for i in $(seq 1 "$runs"); do
  if [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ]; then
    echo "deadline $DEADLINE reached before run $i"
    break
  fi
  start=$(($(stat -c %s "$pglog") + 1))
  tlog="$out/run-$i.test.log"
  if HARNESS_BACKEND=dsn HARNESS_DSN="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable" \
    "$out/worker.test" -test.count=1 -test.v -test.run "$test_re" >"$tlog" 2>&1; then
    r=PASS; pass=$((pass + 1))
  else
    r=FAIL
  fi
  ran=$i
  sleep 0.2 # let the server write the run's last messages
  seg="$out/run-$i.server.log"
  tail -c +"$start" "$pglog" >"$seg"
  report="$(waits "$seg" "$i")"
  f=$(grep -c '^run [0-9]* FETCH-WAIT' <<<"$report")
  o=$(grep -c '^run [0-9]* other-wait' <<<"$report")
  s=$(grep -o 'sampled: [0-9]*' "$tlog" | awk '{n += $2} END {print n + 0}')
  fetch_waits=$((fetch_waits + f)) other_waits=$((other_waits + o)) sampled=$((sampled + s))
  echo "run $i: $r, logged waits: $f fetch on a row, $o other; sampler: $s"
  grep -h 'sampled:' "$tlog" | sed "s/^ */run $i sampler: /"
  [ "$r" = FAIL ] && echo "run $i test output: $tlog"
  [ -n "$report" ] && echo "$report"
  [ "$r" = PASS ] && [ "$s" = 0 ] && rm -f "$tlog"
  [ "$f" = 0 ] && [ "$s" = 0 ] && [ "$r" = PASS ] && rm -f "$seg"
done
echo "ran $ran of $runs on $version: passed $pass; logged lock waits: $fetch_waits of fetch_work_item on a row, $other_waits others (extension locks, other functions); sampler saw $sampled"
[ "$pass" = "$ran" ] && [ "$fetch_waits" = 0 ]
