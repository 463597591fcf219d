#!/usr/bin/env bash
# tests/fuzz/run_long.sh - longer libFuzzer runs of every target, with a
# summary table (the figures docs/fuzzing.md records).
#
#   tests/fuzz/run_long.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Default 300 s per target, every build/fuzz/libfuzzer_* (ninja fuzz-libfuzzer).
# Each starts from its seed corpus (tests/fuzz/corpus/NAME, never written)
# and keeps what it finds in build/fuzz-long/NAME/ (a later run continues
# from there); crashes go to build/fuzz-long/crash-NAME-*. Prints one line
# per target (executions, exec/s, coverage edges, features, corpus size,
# crashes) and writes build/fuzz-long/summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-300}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for b in build/fuzz/libfuzzer_*; do targets+=("${b#build/fuzz/libfuzzer_}"); done
fi
out=build/fuzz-long
mkdir -p "$out"
summary=$out/summary.md
{
    echo "| target | seconds | executions | exec/s | coverage (edges) | features | corpus | crashes |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
} > "$summary"
for t in "${targets[@]}"; do
    bin=build/fuzz/libfuzzer_$t
    [ -x "$bin" ] || { echo "run_long: $bin is not built (ninja fuzz-libfuzzer)" >&2; exit 2; }
    mkdir -p "$out/$t"
    seeds=tests/fuzz/corpus/$t
    [ -d "$seeds" ] || seeds=
    log=$out/$t.log
    "$bin" -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 -timeout=30 \
        -artifact_prefix="$out/crash-$t-" "$out/$t" $seeds > "$log" 2>&1
    rc=$?
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1)
    rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | grep -oP 'cov: \K[0-9]+')
    ft=$(echo "$last" | grep -oP 'ft: \K[0-9]+')
    corp=$(echo "$last" | grep -oP 'corp: \K[0-9]+')
    crashes=$(ls "$out"/crash-"$t"-* 2>/dev/null | wc -l)
    [ $rc -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="exit $rc (see $log)"
    printf '%-14s %5ss  %10s execs  %7s/s  cov %5s  ft %6s  corpus %5s  crashes %s\n' \
        "$t" "$secs" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes"
    echo "| $t | $secs | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $crashes |" >> "$summary"
done
echo "summary: $summary"
