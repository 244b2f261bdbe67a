#!/usr/bin/env bash
# Runs the fuzz targets under fuzz/ (cargo-fuzz, libFuzzer), each for FUZZ_SECS (default
# 600), from the committed seeds (fuzz/seeds/<target>) and a working corpus kept under
# fuzz/corpus/ (not committed). Prints each target's executions and whether it found
# anything; a finding leaves its input under fuzz/artifacts/<target>/ and fails the run.
#
#   scripts/fuzz.sh [TARGET...]      (default: every target)
#
# cargo-fuzz is installed if missing. It asks for nightly compiler flags; the one toolchain
# here is stable, so RUSTC_BOOTSTRAP=1 lets stable take them. No sanitizer (-s none): the
# crate has one small unsafe block, and the targets look for panics and broken invariants.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/fuzz"
FUZZ_SECS="${FUZZ_SECS:-600}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(jsonrpc_envelope dialect_roundtrip relay_rewrite sse_decoder agent_file)
cargo fuzz build -O -s none "${TARGETS[@]/#/}" 2>/dev/null || cargo fuzz build -O -s none
status=0
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="$(mktemp)"
    if cargo fuzz run -O -s none "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$FUZZ_SECS" -print_final_stats=1 -close_fd_mask=3 > "$log" 2>&1; then
        verdict="no findings"
    else
        verdict="FOUND A CRASH (see fuzz/artifacts/$t/)"; status=1
    fi
    execs=$(awk -F: '/stat::number_of_executed_units/ {gsub(/ /, "", $NF); print $NF}' "$log")
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
    printf '%-18s %s executions in %ss, %s, %s\n' "$t" "${execs:-?}" "$FUZZ_SECS" "${cov:-cov: ?}" "$verdict"
    rm -f "$log"
done
exit $status
