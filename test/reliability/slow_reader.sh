#!/usr/bin/env bash
# Runs COMMAND with its stdout piped into a reader that starts reading only after SLEEP_S seconds,
# then prints the last TAIL_BYTES bytes it read. Exits with COMMAND's exit code.
#
#   slow_reader.sh SLEEP_S TAIL_BYTES -- COMMAND...
set -o pipefail
sleep_s=$1 tail_bytes=$2
shift 3
"$@" | (sleep "$sleep_s"; tail -c "$tail_bytes")
