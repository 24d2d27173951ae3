#!/usr/bin/env bash
# Runs `make repro` RUNS times in a row (default 10) while one load loop per
# core keeps every core busy, and prints each verdict: how the repro's
# verdicts were checked to hold on a busy machine.
#   scripts/repro-under-load.sh [RUNS] [busy|fork]
# The load (second argument, or LOAD=busy|fork; default busy):
#   busy  one busy loop per core: `while :; do :; done`
#   fork  one shell loop per core forking `date` each iteration (a CI box
#         running builds): `while :; do date >/dev/null; done`
# REPRO=KINDS runs `harness-lab repro KINDS` (e.g. REPRO=organic) instead of
# `make repro`, with the same --report and --json; OUT (default out) is
# where the runs go: OUT/under-load/run-N (and run-N.log).
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
load="${2:-${LOAD:-busy}}"
case "$runs" in '' | *[!0-9]*) echo "usage: $0 [RUNS] [busy|fork]" >&2; exit 2 ;; esac
case "$load" in busy | fork) ;; *) echo "usage: $0 [RUNS] [busy|fork] (load $load?)" >&2; exit 2 ;; esac
repro="${REPRO:-}"
out="${OUT:-out}/under-load"
mkdir -p "$out"
if [ -n "$repro" ]; then
  go build -o "$out/harness-lab" ./harness/cmd/harness-lab || exit 1
fi
loops=()
stop() {
  if [ "${#loops[@]}" -gt 0 ]; then
    kill "${loops[@]}" 2>/dev/null
    wait "${loops[@]}" 2>/dev/null
  fi
  loops=()
}
trap stop EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$(nproc)"); do
  if [ "$load" = fork ]; then
    ( while :; do date >/dev/null; done ) &
  else
    ( while :; do :; done ) &
  fi
  loops+=($!)
done
pass=0
for i in $(seq 1 "$runs"); do
  log="$out/run-$i.log"
  if [ -n "$repro" ]; then
    # shellcheck disable=SC2086 # KINDS is a list of words
    "$out/harness-lab" repro $repro --report "$out/run-$i" --json "$out/run-$i/repro.json" >"$log" 2>&1
  else
    make -s repro OUT="$out/run-$i" >"$log" 2>&1
  fi
  rc=$?
  if [ "$rc" = 0 ]; then pass=$((pass + 1)); r=pass; else r=FAIL; fi
  echo "run $i: $r: $(grep -E '^verdict ' "$log" | tr -s ' ') (log: $log)"
  grep -E '^verdict: ' "$log" | sed 's/^/  runtime /' 
  grep -E '^refused acks: ' "$log" | tr -s ' ' | sed 's/^/  /'
done
echo "passed $pass of $runs with $(nproc) $load loop(s)"
[ "$pass" = "$runs" ]
