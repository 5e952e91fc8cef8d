#!/usr/bin/env bash
# Runs every test of the workspace against real servers: the embedded SQLite default, the
# PostgreSQL on 127.0.0.1:5432 (started if it is down) and a DynamoDB Local on 127.0.0.1:8000
# (installed from the npm registry on first use and started if it is down). Fails loudly if a
# server does not answer. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

export AWS_EC2_METADATA_DISABLED=true
export EVE_TEST_POSTGRES_URL="${EVE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export EVE_TEST_DYNAMODB_ENDPOINT="${EVE_TEST_DYNAMODB_ENDPOINT:-http://127.0.0.1:8000}"
# The PostgreSQL binaries (initdb, pg_ctl) eve-server's postgres_faults test makes its own cluster with.
export EVE_TEST_PG_BIN="${EVE_TEST_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "PostgreSQL is not answering on 127.0.0.1:5432; starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 || { echo "FATAL: PostgreSQL does not answer on 127.0.0.1:5432" >&2; exit 1; }

if [ -f .ci/dynamodb-local.sh ]; then
  bash .ci/dynamodb-local.sh
fi

# The eve-server browser test drives Debian's Chromium through chromedriver (installed once, as root).
command -v chromium >/dev/null && command -v chromedriver >/dev/null || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || echo "WARNING: chromium/chromedriver could not be installed (not root, or apt-get failed): the eve-server browser test will be skipped"

# The eve-mcp client test drives the server with the official MCP Python SDK (pinned), from a venv
# made once and reused.
MCP_VENV="${EVE_MCP_VENV:-/var/tmp/eve-mcp-venv}"
if [ ! -x "$MCP_VENV/bin/python" ] || ! "$MCP_VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("mcp") == "2.3.0"' 2>/dev/null; then
  python3 -m venv "$MCP_VENV" && "$MCP_VENV/bin/pip" install -q "mcp==2.3.0" || echo "WARNING: the MCP Python SDK could not be installed: the eve-mcp Python client test will be skipped"
fi
"$MCP_VENV/bin/python" -c "import mcp" 2>/dev/null && export EVE_TEST_MCP_PYTHON="$MCP_VENV/bin/python"
# The eve-server OpenAPI test validates /v1/openapi.json with openapi-spec-validator and every live
# answer with openapi-core (pinned; openapi-core 0.23.1 needs openapi-spec-validator 0.8.x), in the
# same venv.
if [ -x "$MCP_VENV/bin/python" ] && ! "$MCP_VENV/bin/python" -c 'import importlib.metadata as m; assert m.version("openapi-core") == "0.23.1" and m.version("openapi-spec-validator") == "0.8.5"' 2>/dev/null; then
  "$MCP_VENV/bin/pip" install -q "openapi-core==0.23.1" "openapi-spec-validator==0.8.5" || echo "WARNING: openapi-core/openapi-spec-validator could not be installed: the eve-server OpenAPI check will be skipped"
fi
"$MCP_VENV/bin/python" -c "import openapi_core, openapi_spec_validator" 2>/dev/null && export EVE_TEST_OPENAPI_PYTHON="$MCP_VENV/bin/python"

# The eve-mcp host test also drives the server with the official MCP TypeScript SDK (pinned), from
# the npm registry, installed once into a directory reused by later runs.
MCP_NODE="${EVE_MCP_NODE:-/var/tmp/eve-mcp-node}"
if command -v node >/dev/null && command -v npm >/dev/null; then
  if ! node -e "process.exit(require('$MCP_NODE/node_modules/@modelcontextprotocol/sdk/package.json').version === '1.32.2' ? 0 : 1)" 2>/dev/null; then
    mkdir -p "$MCP_NODE" && npm install --prefix "$MCP_NODE" --silent --no-audit --no-fund "@modelcontextprotocol/sdk@1.32.2" >/dev/null || echo "WARNING: the MCP TypeScript SDK could not be installed: the eve-mcp TypeScript host test will be skipped"
  fi
  [ -f "$MCP_NODE/node_modules/@modelcontextprotocol/sdk/package.json" ] && export EVE_TEST_MCP_NODE_MODULES="$MCP_NODE/node_modules"
else
  echo "WARNING: node/npm not found: the eve-mcp TypeScript host test will be skipped"
fi

cargo test --workspace "$@"
# The workspace build has every feature on (eve-examples' dev-dependency on eve-cli); eve-cli's
# unit tests again on its default (SQLite only), where the other backends and span export are
# refused.
cargo test -p eve-cli --lib
