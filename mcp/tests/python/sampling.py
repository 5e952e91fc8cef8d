"""The official MCP Python SDK serves eve's subagent calls (`ctx.agent`) with its sampling callback.

Usage: sampling.py SERVER_EXE [ARGS...]  (stdio: spawns the server, which writes its pid to the file
                                          EVE_MCP_TEST_PID_FILE names; its environment is inherited)
   or: sampling.py http://HOST:PORT/mcp   (streamable HTTP: everything but the SIGKILL part).

Calls the test tool `delegate` (a subagent call `security-reviewer`, key `review`, with an output
schema) as a blocking call:
  served       the sampling callback answers with a verdict; the call completes with it;
  mismatch     the callback's text does not satisfy the schema: a clear error, nothing recorded;
  no_sampling  a session without a sampling callback: an error naming the `sampling` capability;
  killed       (stdio) the callback SIGKILLs the server while the request is pending;
  restarted    (stdio) a new server on the same store, the same call (same `eve/callKey`): the
               same request again, answered; the call completes.
Prints one JSON line per step for the Rust test to assert on.
"""

import json
import os
import signal
import sys

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

CALL_KEY = "eve/callKey"


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def transport():
    if sys.argv[1].startswith("http"):
        return streamable_http_client(sys.argv[1])
    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    return stdio_client(server)


def sampler(text, seen):
    """A sampling callback answering every request with `text`, recording each request."""

    async def sample(context, params):
        seen.append(
            {
                "meta": params.meta,
                "system": params.system_prompt,
                "maxTokens": params.max_tokens,
                "message": params.messages[0].content.text,
            }
        )
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=text),
            model="python-test-model",
        )

    return sample


def error_fields(e):
    error = getattr(e, "error", None)
    return {
        "error": str(e),
        "code": getattr(error, "code", None),
        "data": getattr(error, "data", None),
    }


async def call(sampling_callback, topic, key):
    """Calls `delegate` in a new session: the result, or the error's fields (inside the session,
    so that the JSON-RPC error is not wrapped in the session's task group)."""
    async with transport() as (read, write):
        async with ClientSession(read, write, sampling_callback=sampling_callback) as session:
            await session.initialize()
            try:
                return await session.call_tool("delegate", {"topic": topic}, meta={CALL_KEY: key})
            except Exception as e:  # McpError
                return error_fields(e)


async def main():
    stdio = not sys.argv[1].startswith("http")

    seen = []
    result = await call(sampler('{"verdict": "pass", "notes": "python"}', seen), "login", "py-served")
    out("served", is_error=result.is_error, structured=result.structured_content, sampled=seen)

    seen = []
    failed = await call(sampler('{"verdict": "maybe"}', seen), "tls", "py-mismatch")
    out("mismatch", sampled=seen, **(failed if isinstance(failed, dict) else {"error": None}))

    failed = await call(None, "cookies", "py-no-sampling")
    out("no_sampling", **(failed if isinstance(failed, dict) else {"error": None}))

    if not stdio:
        return

    # SIGKILL the server while its sampling request is pending, then call again.
    first = []

    async def kill(context, params):
        first.append({"meta": params.meta})
        with open(os.environ["EVE_MCP_TEST_PID_FILE"]) as f:
            pid = int(f.read().strip())
        os.kill(pid, signal.SIGKILL)
        await anyio.sleep_forever()

    try:
        with anyio.fail_after(30):
            killed = await call(kill, "restart", "py-restart")
        killed = killed.get("error") if isinstance(killed, dict) else None
    except BaseException as e:  # the connection dies with the server (an exception group)
        killed = repr(e)[:300]
    out("killed", sampled=first, error=killed)

    second = []
    result = await call(sampler('{"verdict": "pass", "notes": "after restart"}', second), "restart", "py-restart")
    out("restarted", is_error=result.is_error, structured=result.structured_content, sampled=second)


anyio.run(main)
