"""The official MCP Python SDK as an agent host whose person says no, presses stop and closes.

Usage: host.py SERVER_EXE [ARGS...]  (stdio: spawns the server; its environment is inherited)
   or: host.py http://HOST:PORT/mcp   (streamable HTTP).
Declines the approval of `transfer`, cancels the confirmation of `deploy_approval`, stops a
blocking call of `nap` once it reports progress (the SDK sends `notifications/cancelled`), calls
the background tool `refund_order` (its receipt comes at once), then closes the session. Prints
one JSON line per step; the Rust test reads the store to check what each did to the runs.
"""

import json
import sys

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

action = {"value": "decline"}
asked = []
logs = []


async def elicit(context, params):
    asked.append(params.message)
    return types.ElicitResult(action=action["value"])


async def on_log(params):
    logs.append(params.data)


def out(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def transport():
    if sys.argv[1].startswith("http"):
        return streamable_http_client(sys.argv[1])
    import os

    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    return stdio_client(server)


async def main():
    async with transport() as (read, write):
        async with ClientSession(
            read, write, elicitation_callback=elicit, logging_callback=on_log
        ) as session:
            await session.initialize()
            with anyio.fail_after(20):
                denied = await session.call_tool("transfer", {"cents": 5})
            out(
                "declined",
                is_error=denied.is_error,
                meta=denied.meta,
                text=[c.text for c in denied.content if c.type == "text"],
            )
            action["value"] = "cancel"
            with anyio.fail_after(20):
                cancelled = await session.call_tool("deploy_approval", {"service": "api"})
            out("cancelled", is_error=cancelled.is_error, structured=cancelled.structured_content)

            napping = anyio.Event()

            async def on_progress(progress, total, message):
                napping.set()

            async with anyio.create_task_group() as tg:

                async def nap():
                    await session.call_tool("nap", {}, progress_callback=on_progress)

                tg.start_soon(nap)
                with anyio.fail_after(20):
                    await napping.wait()
                tg.cancel_scope.cancel()  # the stop button: the SDK sends notifications/cancelled
            # One more round trip: the cancellation went out before it.
            weighed = await session.call_tool("weigh", {"grams": 250})
            out("stopped", after=weighed.structured_content)

            with anyio.fail_after(20):
                receipt = await session.call_tool(
                    "refund_order", {"order_id": "o-7", "amount": 3.5}
                )
            out("receipt", structured=receipt.structured_content, is_error=receipt.is_error)
    out("closed", asked=asked, logs=[json.loads(json.dumps(d, default=str)) for d in logs])


anyio.run(main)
