#!/bin/sh
# fuzz/run.sh FLAGS TARGET... -- runs each fuzz target in turn (fuzz/Makefile)
#
# FLAGS are libFuzzer's (-max_total_time=60, -runs=10000000, ...).  Each
# target reads fuzz/corpus/<target> (the committed seeds) and grows
# $FUZZ_OUT/corpus/<target>; a crash input lands in
# $FUZZ_OUT/artifacts/<target>/, the whole log in $FUZZ_OUT/<target>.log.
# One line per target says how many executions ran and how fast; the
# summary is also appended to $FUZZ_OUT/summary.txt.  Exits 1 when any
# target crashed, hung, leaked or over-read.
set -u
out=${FUZZ_OUT:-build/fuzz}
flags=$1
shift
failed=""
for t in "$@"; do
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
  extra=""
  case $t in
    ledger) extra="-max_len=2248704" ;; # one whole ledger file
  esac
  log="$out/$t.log"
  echo "fuzz_$t: running ($flags)"
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$out/fuzz_$t" "$out/corpus/$t" "fuzz/corpus/$t" $flags $extra -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$out/artifacts/$t/" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  corpus=$(ls "$out/corpus/$t" | wc -l)
  if [ "$rc" -eq 0 ]; then
    verdict="no crash"
  else
    verdict="FAILED (exit $rc), see $log"
    failed="$failed $t"
    tail -n 60 "$log"
    ls -l "$out/artifacts/$t/"
  fi
  line="fuzz_$t: ${runs:-?} executions in ${secs} s (${speed:-?}/s), corpus $corpus: $verdict"
  echo "$line"
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) [$flags] $line" >>"$out/summary.txt"
done
if [ -n "$failed" ]; then
  echo "fuzz: failed:$failed"
  exit 1
fi
echo "fuzz: all clean: $*"
