#!/usr/bin/env bash
# The GPU checks: now tests/gpu/session.sh (one command, stages with time
# limits, results.json); this wrapper is kept for old instructions.
#   bash tests/gpu/run.sh               = bash tests/gpu/session.sh
#   bash tests/gpu/run.sh --build-only  = the probe and build stages only
#                                         (check_kernels in $SESSION_WORK)
# Other arguments go to session.sh.
if [ "${1:-}" = "--build-only" ]; then
  shift
  exec bash "$(dirname "$0")/session.sh" --stages probe,build "$@"
fi
exec bash "$(dirname "$0")/session.sh" "$@"
