# Sourced by scripts/api-check and scripts/console-check: a work directory, and services started
# from the debug build that are stopped (and the directory removed) when the script exits.
#   start NAME ARGS…   runs `idgen ARGS…` with its output in $WORK/NAME.log, and sets URL to the
#                      URL it says it listens on ("… listening on http…"). Not in a $(…): the
#                      process must be this shell's child, for the exit trap to stop it.
#   on_exit COMMAND    one more thing to do at exit, after the services are stopped

BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/idgen"
[ -x "$BIN" ] || { echo "$BIN is missing: cargo build --workspace --bins first" >&2; exit 1; }
WORK=$(mktemp -d -t "idgen-$(basename "$0").XXXXXX")
PIDS=()
EXIT_HOOKS=()

on_exit() { EXIT_HOOKS+=("$*"); }

stop_all() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for hook in "${EXIT_HOOKS[@]}"; do eval "$hook" || true; done
  rm -rf "$WORK"
}
trap stop_all EXIT

start() {
  local name=$1; shift
  : >"$WORK/$name.log" # before the child, which opens it only once it runs
  "$BIN" "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  local pid=$! url=""
  for _ in $(seq 1 300); do
    url=$(sed -n 's/.* listening on \(http[^ ]*\).*/\1/p' "$WORK/$name.log" | head -n 1)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$WORK/$name.log" >&2; echo "$name did not start" >&2; return 1; }
  URL=$url
}

# Waits until the worker at URL answers /healthz with 200 (issuing), or fails with its log.
wait_issuing() {
  local url=$1 name=$2
  for _ in $(seq 1 100); do curl -sf -o /dev/null "$url/healthz" && return 0; sleep 0.1; done
  cat "$WORK/$name.log" >&2
  echo "the $name is not issuing" >&2
  return 1
}
