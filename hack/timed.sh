#!/usr/bin/env bash
# One set-up step of `make test` (or `make run`, `make demo`), timed and quiet:
#
#   hack/timed.sh STEP COMMAND [ARGS...]
#   hack/timed.sh --reset          a new run: forget the steps of the last one, note when it started
#
# COMMAND's whole output goes to out/logs/STEP.log. The terminal gets one line when the step starts, the progress
# lines of our own scripts (those starting with a `[name]` tag, such as `[build-upstream] kubernetes: built in 412 s`)
# as they come, and one line when it ends, with its seconds; if it fails, the end of its log. The seconds and the CPU
# seconds of the step's whole process tree (hack/children-cpu.sh) are appended to out/timing/setup.tsv
# (`STEP<TAB>seconds<TAB>ok|failed<TAB>CPU seconds`), which tests/timing_report.py puts in its report.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
timing="${CAPI_LIBVIRT_TIMING_DIR:-$repo/out/timing}"
logs="$repo/out/logs"
mkdir -p "$timing" "$logs"
source "$repo/hack/children-cpu.sh"

if [ "${1:-}" = --reset ]; then
  : >"$timing/setup.tsv"
  date +%s.%N >"$timing/setup-started"
  exit 0
fi
[ "$#" -ge 2 ] || { echo "usage: $0 STEP COMMAND [ARGS...] | --reset" >&2; exit 2; }
step=$1; shift
log="$logs/$step.log"
: >"$log"

started=$(date +%s.%N)
children_cpu_ticks cpu_before
printf '[setup] %s: started (log: out/logs/%s.log)\n' "$step" "$step" >&2
# In the foreground (Ctrl-C reaches it), its output into the log and our scripts' own progress lines to the terminal.
"$@" 2>&1 | tee -a "$log" | { grep --line-buffered -E '^\[[a-z0-9-]+\] ' | sed -u 's/^/  /' >&2; true; }
rc=${PIPESTATUS[0]}
cpu_seconds_since "$cpu_before" cpu
seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$started" "$(date +%s.%N)")
if [ "$rc" -eq 0 ]; then
  printf '%s\t%s\tok\t%s\n' "$step" "$seconds" "$cpu" >>"$timing/setup.tsv"
  printf '[setup] %s: done in %s s (%s s of CPU)\n' "$step" "$seconds" "$cpu" >&2
else
  printf '%s\t%s\tfailed\t%s\n' "$step" "$seconds" "$cpu" >>"$timing/setup.tsv"
  printf '[setup] %s: FAILED (exit %s) after %s s; the end of out/logs/%s.log:\n' "$step" "$rc" "$seconds" "$step" >&2
  tail -n 40 "$log" >&2
fi
exit "$rc"
