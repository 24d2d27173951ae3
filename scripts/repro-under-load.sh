#!/usr/bin/env bash
# Runs `make repro` RUNS times in a row (default 10) while one busy loop per
# core keeps every core busy, and prints each verdict: how the repro's
# verdicts were checked to hold on a busy machine.
#   scripts/repro-under-load.sh [RUNS]
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
case "$runs" in '' | *[!0-9]*) echo "usage: $0 [RUNS]" >&2; exit 2 ;; esac
out="${OUT:-out}/under-load"
mkdir -p "$out"
busy=()
for _ in $(seq 1 "$(nproc)"); do
  ( while :; do :; done ) &
  busy+=($!)
done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT
pass=0
for i in $(seq 1 "$runs"); do
  log="$out/run-$i.log"
  if make -s repro OUT="$out/run-$i" >"$log" 2>&1; then pass=$((pass + 1)); r=pass; else r=FAIL; fi
  echo "run $i: $r: $(grep -E '^verdict ' "$log" | tr -s ' ') (log: $log)"
done
echo "passed $pass of $runs with $(nproc) busy loop(s)"
[ "$pass" = "$runs" ]
