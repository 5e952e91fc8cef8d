"""The official MCP Python SDK as a client of `eve-mcp` over stdio.

Usage: client.py SERVER_EXE [ARGS...]  (stdio: spawns the server; its environment is inherited)
   or: client.py http://HOST:PORT/mcp   (streamable HTTP; with EVE_MCP_BEARER set, sent as
                                          `Authorization: Bearer …`).
Lists the tools, calls deploy_approval without the tasks extension and answers its approval
through elicitation, calls remind (whose steps print to stdout: over stdio that must not reach
the protocol), then prints one JSON line per step for the Rust test to assert on.
"""

import json
import os
import sys

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

asked = []
# The notifications/message data received (eve's notices and pushed task ends).
logs = []
# What the transport could not parse (a line on the server's stdout that is not JSON-RPC).
stream_errors = []


async def on_message(message):
    if isinstance(message, Exception):
        stream_errors.append(repr(message))


async def elicit(context, params):
    schema = params.requested_schema
    options = [o["const"] for o in schema["properties"]["option"]["oneOf"]]
    labels = [o["title"] for o in schema["properties"]["option"]["oneOf"]]
    asked.append({"message": params.message, "options": options, "labels": labels})
    return types.ElicitResult(action="accept", content={"option": "approve"})


async def on_log(params):
    logs.append(params.data)


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def transport():
    if sys.argv[1].startswith("http"):
        key = os.environ.get("EVE_MCP_BEARER")
        if key:
            client = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
            return streamable_http_client(sys.argv[1], http_client=client)
        return streamable_http_client(sys.argv[1])
    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    return stdio_client(server)


async def main():
    async with transport() as (read, write):
        async with ClientSession(
            read,
            write,
            elicitation_callback=elicit,
            message_handler=on_message,
            logging_callback=on_log,
        ) as session:
            init = await session.initialize()
            out("initialized", server=init.server_info.name, protocol=init.protocol_version)
            tools = await session.list_tools()
            deploy = next(t for t in tools.tools if t.name == "deploy_approval")
            out(
                "tools",
                names=sorted(t.name for t in tools.tools),
                deploy_schema=deploy.input_schema,
                deploy_meta=deploy.meta,
            )
            result = await session.call_tool("deploy_approval", {"service": "api"})
            out(
                "called",
                is_error=result.is_error,
                structured=result.structured_content,
                text=[c.text for c in result.content if c.type == "text"],
                asked=asked,
            )
            # A background tool: the receipt at once, its end pushed as notifications/message.
            printed = await session.call_tool("remind", {"note": "tea", "delay": "1s"})
            task = (printed.structured_content or {}).get("taskId")
            ended = None
            with anyio.fail_after(20):
                while ended is None:
                    ended = next(
                        (d for d in logs if isinstance(d, dict) and d.get("taskId") == task
                         and d.get("kind") == "task.completed"),
                        None,
                    )
                    if ended is None:
                        await anyio.sleep(0.02)
            out(
                "printed",
                is_error=printed.is_error,
                structured=printed.structured_content,
                ended=ended,
                stream_errors=stream_errors,
            )
            try:
                await session.call_tool("no_such_tool", {})
                out("unknown_tool", error=None)
            except Exception as e:  # McpError
                out("unknown_tool", error=str(e), code=getattr(getattr(e, "error", None), "code", None))


anyio.run(main)
