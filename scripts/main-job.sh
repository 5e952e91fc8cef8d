#!/usr/bin/env bash
# The main job: the reminder workflow tool on the embedded SQLite default, end to end, with its
# worker process killed mid-step and a new one finishing the run.
set -euo pipefail
cd "$(dirname "$0")/.."
db="${1:-$(mktemp -d)/eve-demo.db}"
cargo run -q -p eve-examples --bin reminder -- demo --db "$db"
