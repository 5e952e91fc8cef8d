#!/usr/bin/env bash
# Installs (once per machine) and starts AWS's DynamoDB Local on 127.0.0.1:8000, then prints the
# endpoint. DynamoDB Local 1.25.1 ships inside the npm package amplify-dynamodb-simulator@2.9.30;
# the extracted jar is cached outside the clone (~/.cache/eve-workflow/dynamodb-local, or
# $EVE_DYNAMODB_LOCAL_CACHE) so a machine downloads it once.
# Idempotent: if something already answers DynamoDB calls on the port, it is left running.
# Exits non-zero, loudly, if DynamoDB Local cannot be installed or does not answer within ~30 s.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${EVE_DYNAMODB_LOCAL_PORT:-8000}"
ENDPOINT="http://127.0.0.1:${PORT}"
PKG="amplify-dynamodb-simulator@2.9.30"
# Outside the clone, so CI's fresh clones on one machine share one download.
CACHE="${EVE_DYNAMODB_LOCAL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eve-workflow/dynamodb-local}"
JAR="$CACHE/package/emulator/DynamoDBLocal.jar"
LOG="$CACHE/dynamodb-local.log"

fail() { echo "FATAL (dynamodb-local): $*" >&2; exit 1; }

# A ListTables call with dummy static credentials: DynamoDB Local answers it with 200 and a JSON
# body naming TableNames. Anything else on the port (another service) is not DynamoDB Local.
answers() {
  curl -s --max-time 2 -X POST "$ENDPOINT/" \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=evelocal/20250101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}' 2>/dev/null | grep -q TableNames
}

if answers; then
  echo "DynamoDB Local already answers at $ENDPOINT"
  echo "$ENDPOINT"
  exit 0
fi

command -v java >/dev/null || fail "java is not installed (DynamoDB Local needs Java 17: apt-get install openjdk-17-jre-headless)"
command -v curl >/dev/null || fail "curl is not installed (apt-get install curl)"

if [ ! -f "$JAR" ]; then
  command -v npm >/dev/null || fail "npm is not installed (apt-get install npm); it fetches $PKG"
  echo "Installing DynamoDB Local from the npm package $PKG into $CACHE"
  mkdir -p "$CACHE"
  tmp="$(mktemp -d)"
  ( cd "$tmp" && npm pack --silent "$PKG" >/dev/null ) || fail "npm pack $PKG failed"
  tarball="$(ls "$tmp"/*.tgz 2>/dev/null | head -n1)"
  [ -n "$tarball" ] || fail "npm pack $PKG produced no tarball"
  rm -rf "$CACHE/package"
  tar -xzf "$tarball" -C "$CACHE" || fail "could not extract $tarball"
  rm -rf "$tmp"
  [ -f "$JAR" ] || fail "the package has no emulator/DynamoDBLocal.jar (expected $JAR)"
fi

echo "Starting DynamoDB Local on $ENDPOINT (log: $LOG)"
(
  cd "$CACHE"
  nohup java -Djava.library.path=package/emulator/DynamoDBLocal_lib \
    -jar package/emulator/DynamoDBLocal.jar \
    -inMemory -sharedDb -disableTelemetry -port "$PORT" >"$LOG" 2>&1 &
  echo $! >"$CACHE/dynamodb-local.pid"
)
pid="$(cat "$CACHE/dynamodb-local.pid")"

for _ in $(seq 1 60); do
  if answers; then
    echo "DynamoDB Local answers at $ENDPOINT (pid $pid)"
    echo "$ENDPOINT"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -n 30 "$LOG" >&2 || true
    fail "DynamoDB Local (pid $pid) exited before answering on $ENDPOINT; see $LOG"
  fi
  sleep 0.5
done
tail -n 30 "$LOG" >&2 || true
fail "DynamoDB Local did not answer on $ENDPOINT within 30 s; see $LOG"
