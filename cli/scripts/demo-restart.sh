#!/usr/bin/env bash
# The demo a newcomer sees first, run without a person: `eve serve --demo` on the embedded SQLite
# default (eve.db in a fresh directory). A scripted agent calls deploy_approval (the seed's
# deploy), whose body asks for approval with ctx.ask; the server prints the page's URL and the
# `eve answer` command. The server is killed with SIGKILL while the ask is pending and started
# again; the restarted demo shows the same request, the printed command approves it, and the run
# finishes (the server then stops by itself). Interactively: `eve serve --demo` and answer on the
# page or with the printed command.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q -p eve-examples --bin eve
eve="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/debug/eve"
dir="${1:-$(mktemp -d)}"
cd "$dir"
echo "--- in $dir: eve serve --demo (store sqlite://eve.db, the default)"

# Waits up to 60 s for a line matching $2 in file $1.
wait_for() {
  for _ in $(seq 600); do
    if grep -q -- "$2" "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "FATAL: no line matching '$2' in $1:" >&2
  cat "$1" >&2
  exit 1
}

"$eve" serve --demo --listen 127.0.0.1:0 > >(tee first.log) &
first=$!
wait_for first.log "or run: eve answer"
kill -9 "$first"
wait "$first" 2>/dev/null || true
echo "--- the server was killed (SIGKILL) while the ask is pending; starting it again"

"$eve" serve --demo --listen 127.0.0.1:0 > >(tee second.log) &
second=$!
wait_for second.log "or run: eve answer"
answer="$(grep -o 'eve answer .*' second.log | tail -n 1)"
echo "--- approving: $answer"
# shellcheck disable=SC2086 # the printed command is split into its words on purpose
"$eve" ${answer#eve }
wait_for second.log "eve serve: stopped"
wait "$second"
grep -q '"deployed":true' second.log || { echo "FATAL: the run did not deploy" >&2; exit 1; }
run="$(grep -o 'run run_[0-9a-f]*' second.log | head -n 1 | cut -d' ' -f2)"
echo "--- the run's journal (eve journal $run):"
"$eve" journal "$run"
