#!/bin/bash
# compute-sanitizer over the Lua tests on the cuda backend (make
# test-gpu-sanitize): memcheck on every file, racecheck and synccheck on the
# kernel tests.  One line per file and tool: the tool, the file, the exit
# status, the sanitizer's summary and the number of failed tests; a run that
# does not exit 0 is followed by the last 40 lines of its output that are not
# "ok" results, and makes the script exit 1.
#
# Children a test starts on purpose (tests/gpu/kernels.lua's illegal-address
# run) are not followed; API errors are not reported (every call's status is
# checked by the code, and one test makes a failing call on purpose to find a
# signature mismatch).
#
# Run from the repository root.  Variables (the Makefile passes them):
#   SANITIZER          the compute-sanitizer command (default: the one on PATH,
#                      else /usr/local/cuda/bin/compute-sanitizer)
#   GPULUA             the gpulua binary (default build/gpulua)
#   SANITIZE_MEMCHECK  the files for memcheck (when unset: tests/*.lua tests/gpu/*.lua)
#   SANITIZE_RACE      the files for racecheck and synccheck (when unset:
#                      tests/gpu/compare.lua tests/gpu/kernels.lua)
#   GPULUA_TEST_SLOWDOWN  how much longer the tests' time-based premises wait
#                      (default 20: memcheck made a 300 ms window too short)
set -u

SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
GPULUA=${GPULUA:-build/gpulua}
SANITIZE_MEMCHECK=${SANITIZE_MEMCHECK-$(printf '%s\n' tests/*.lua tests/gpu/*.lua | LC_ALL=C sort)}
SANITIZE_RACE=${SANITIZE_RACE-tests/gpu/compare.lua tests/gpu/kernels.lua}

# SANITIZER may carry options of its own: split it into words, as make did
read -r -a sanitizer <<< "$SANITIZER"

st=0
run() {
  local tool=$1 f=$2 out rc summary fails
  out=$(GPULUA_DEVICE=cuda GPULUA_TEST_SLOWDOWN=${GPULUA_TEST_SLOWDOWN:-20} "${sanitizer[@]}" --tool "$tool" --target-processes application-only \
        --error-exitcode 97 --print-limit 20 --report-api-errors no "$GPULUA" "$f" 2>&1)
  rc=$?
  summary=$(printf '%s\n' "$out" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -n 1)
  fails=$(printf '%s\n' "$out" | grep -c '^not ok')
  printf '%-10s %-28s rc=%-3s %s; %s failed tests\n' "$tool" "$f" "$rc" "$summary" "$fails"
  if [ "$rc" -ne 0 ]; then
    st=1
    printf '%s\n' "$out" | grep -vE '^ok ' | tail -n 40
  fi
}

for f in $SANITIZE_MEMCHECK; do run memcheck "$f"; done
for f in $SANITIZE_RACE; do run racecheck "$f"; run synccheck "$f"; done
exit $st
