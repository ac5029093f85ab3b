# Sourced by the test scripts that install what they need first (quant/tests/cross-aarch64.sh,
# tests/check-platforms.sh):
#
#   skip_script NAME WHY-REQUIRED REASON...
#
# Under $DUET_REQUIRE_ORACLES (the test command sets it) a missing prerequisite is a failure:
# "error: NAME: REASON (DUET_REQUIRE_ORACLES is set: WHY-REQUIRED)", exit 1. Otherwise it
# prints "SKIPPED NAME: REASON", appends "NAME: REASON" to $DUET_SKIP_LOG if that is set (as
# tests/run-all.sh's skips are), and exits 0.
skip_script() {
  local name=$1 required=$2
  shift 2
  if [ -n "${DUET_REQUIRE_ORACLES:-}" ]; then
    echo "error: $name: $* (DUET_REQUIRE_ORACLES is set: $required)" >&2
    exit 1
  fi
  echo "SKIPPED $name: $*"
  if [ -n "${DUET_SKIP_LOG:-}" ]; then echo "$name: $*" >> "$DUET_SKIP_LOG"; fi
  exit 0
}
