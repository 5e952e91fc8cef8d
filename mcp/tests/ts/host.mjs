// The official MCP TypeScript SDK as an agent host whose person says no, presses stop, uses a
// host without elicitation, and closes.
//
// Usage: node host.mjs SERVER_EXE [ARGS...]  (stdio: spawns the server; environment inherited)
//    or: node host.mjs http://HOST:PORT/mcp   (streamable HTTP)
// NODE_PATH must hold @modelcontextprotocol/sdk (scripts/test-all.sh installs it). Prints one JSON
// line per step; the Rust test reads the store to check what each did to the runs.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH ?? ".", "noop.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const {
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
  EmptyResultSchema,
} = require("@modelcontextprotocol/sdk/types.js");

const out = (step, fields) => console.log(JSON.stringify({ step, ...fields }));
const target = process.argv[2];

function transport() {
  if (target.startsWith("http")) return new StreamableHTTPClientTransport(new URL(target));
  return new StdioClientTransport({
    command: target,
    args: process.argv.slice(3),
    env: process.env,
    stderr: "inherit",
  });
}

async function until(what, check, ms = 20000) {
  const start = Date.now();
  while (!check()) {
    if (Date.now() - start > ms) throw new Error(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// A host with elicitation: the person declines, then cancels.
let action = "decline";
const logs = [];
const host = new Client({ name: "eve-ts-host", version: "0" }, { capabilities: { elicitation: {} } });
host.setRequestHandler(ElicitRequestSchema, async () => ({ action }));
host.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push(n.params.data));
const hostTransport = transport();
await host.connect(hostTransport);

const denied = await host.callTool({ name: "transfer", arguments: { cents: 5 } }, undefined, { timeout: 20000 });
out("declined", { is_error: denied.isError ?? false, meta: denied._meta ?? null });
action = "cancel";
const cancelled = await host.callTool({ name: "deploy_approval", arguments: { service: "api" } }, undefined, { timeout: 20000 });
out("cancelled", { is_error: cancelled.isError ?? false });

// The stop button: abort a waiting call (the SDK sends notifications/cancelled).
const stop = new AbortController();
let napping = false;
const nap = host
  .callTool({ name: "nap", arguments: {} }, undefined, {
    signal: stop.signal,
    onprogress: () => { napping = true; },
    timeout: 60000,
  })
  .then(() => "settled", (e) => String(e));
await until("nap reports progress", () => napping);
stop.abort("stop");
out("stopped", { call: await nap });

// A host without elicitation: told where the request can be answered, kept alive by progress
// (its timeout of 1 s resets on each notice), then the request is answered elsewhere
// (tasks/update, as another client would) and the call settles with its one result.
const bare = new Client({ name: "eve-ts-bare", version: "0" }, { capabilities: {} });
const bareLogs = [];
bare.setNotificationHandler(LoggingMessageNotificationSchema, (n) => bareLogs.push(n.params.data));
const bareTransport = transport();
await bare.connect(bareTransport);
let notices = 0;
const started = Date.now();
const waiting = bare.callTool({ name: "deploy_approval", arguments: { service: "web" } }, undefined, {
  timeout: 1000,
  resetTimeoutOnProgress: true,
  onprogress: (p) => { if ((p.message ?? "").includes("eve answer")) notices += 1; },
});
await until("a logged notice", () => bareLogs.some((d) => d.kind === "input.requested"));
const notice = bareLogs.find((d) => d.kind === "input.requested");
await until("notices past the 1 s timeout", () => notices >= 2 && Date.now() - started > 1500);
// Another client, one that speaks tasks, answers it (tasks/update needs the tasks extension).
const tasker = new Client(
  { name: "eve-ts-tasks", version: "0" },
  { capabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } } },
);
const taskerTransport = transport();
await tasker.connect(taskerTransport);
await tasker.request(
  {
    method: "tasks/update",
    params: {
      taskId: notice.taskId,
      inputResponses: { [notice.requestId]: { action: "accept", content: { option: "approve" } } },
    },
  },
  EmptyResultSchema.passthrough(),
);
const answered = await waiting;
out("no_elicitation", {
  notice: notice.message,
  notices,
  waited_ms: Date.now() - started,
  is_error: answered.isError ?? false,
  structured: answered.structuredContent ?? null,
});

// A background tool answers its receipt at once.
const receipt = await host.callTool({ name: "refund_order", arguments: { order_id: "o-9", amount: 2.5 } }, undefined, { timeout: 20000 });
out("receipt", { structured: receipt.structuredContent ?? null });

// Close: DELETE /mcp over HTTP, EOF over stdio.
for (const t of [hostTransport, bareTransport, taskerTransport]) {
  if (t.terminateSession) await t.terminateSession();
}
await host.close();
await bare.close();
await tasker.close();
out("closed", { logs: logs.length });
