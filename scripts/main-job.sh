#!/usr/bin/env bash
# The main job: `eve serve --demo` on the embedded SQLite default, end to end. A scripted agent
# calls the deploy tool, whose body asks for approval; the server is killed while the ask is
# pending and started again; the printed `eve answer` command approves; the run finishes and its
# journal is shown. (The reminder demo that kills a worker mid-step is
# `cargo run -p eve-examples --bin reminder -- demo`.)
set -euo pipefail
cd "$(dirname "$0")/.."
# A first build is a cold one: incremental compilation only adds work to it (its caches pay off
# on rebuilds, which `cargo test` and editors make with their own settings).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
bash cli/scripts/demo-restart.sh "$@"
