"""The official MCP Python SDK driving three of the seed's examples through `eve serve`.

Usage: seed_examples.py http://HOST:PORT   (EVE_MCP_BEARER: an admin key; RENDER_FARM_DIR: where
                                            the served render farm writes its callback URLs)
- progress_then_ask: a blocking call; its ask arrives as elicitation and is answered `approve`.
- render_video: a blocking call; meanwhile the render farm (this script) reads the webhook URL
  the step handed it and POSTs `{status, url}` to it; the call returns the URL.
- render_cleanup: a blocking call; the user cancels the run over HTTP (cancellation of a
  blocking call has no MCP counterpart but task mode's `tasks/cancel`); the call ends with an
  error and the run's journal shows the cleanup step.
Prints one JSON line per example for the Rust test to assert on.
"""

import json
import os
import sys

import anyio
import httpx2 as httpx
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BASE = sys.argv[1]
KEY = os.environ["EVE_MCP_BEARER"]
FARM = os.environ["RENDER_FARM_DIR"]
HEADERS = {"Authorization": f"Bearer {KEY}"}
asked = []


async def elicit(context, params):
    options = [o["const"] for o in params.requested_schema["properties"]["option"]["oneOf"]]
    asked.append({"message": params.message, "options": options})
    return types.ElicitResult(action="accept", content={"option": "approve"})


def out(example, **fields):
    print(json.dumps({"example": example, **fields}), flush=True)


def completed_steps(journal):
    """Names of the journal's completed steps (events are externally tagged)."""
    return [
        e["event"]["StepCompleted"]["name"]
        for e in journal["events"]
        if isinstance(e["event"], dict) and "StepCompleted" in e["event"]
    ]


def result_fields(result):
    return {
        "is_error": result.is_error,
        "structured": result.structured_content,
        "text": [c.text for c in result.content if c.type == "text"],
    }


async def until(check, what):
    with anyio.fail_after(60):
        while True:
            found = await check()
            if found is not None:
                return found
            await anyio.sleep(0.05)


async def render_farm(http):
    """Waits for the job's callback URL, then POSTs the finished render to it."""

    async def url():
        try:
            with open(os.path.join(FARM, "job-py1.url")) as f:
                return f.read()
        except FileNotFoundError:
            return None

    callback = await until(url, "the render's callback URL")
    r = await http.post(callback, json={"status": "ok", "url": "https://cdn.example/py1.mp4"})
    return r.status_code


async def cancel_cleanup(http):
    """Once the render runs, cancels its run over HTTP (as the user would)."""

    async def submitted():
        r = await http.get(f"{BASE}/v1/runs", params={"tool": "render_cleanup"}, headers=HEADERS)
        for run in r.json()["runs"]:
            j = (await http.get(f"{BASE}/v1/runs/{run['runId']}", headers=HEADERS)).json()
            if "submit_render" in completed_steps(j):
                return run["runId"]
        return None

    run = await until(submitted, "the render_cleanup run")
    r = await http.post(f"{BASE}/v1/runs/{run}/cancel", json={"reason": "the user stopped it"}, headers=HEADERS)
    return run, r.status_code


async def main():
    client = create_mcp_http_client(headers=HEADERS)
    async with streamable_http_client(f"{BASE}/mcp", http_client=client) as (read, write, *_):
        async with ClientSession(read, write, elicitation_callback=elicit) as session:
            await session.initialize()
            names = sorted(t.name for t in (await session.list_tools()).tools)
            out("tools", names=names)

            result = await session.call_tool("progress_then_ask", {})
            out("progress_then_ask", asked=asked, **result_fields(result))

            async with httpx.AsyncClient() as http:
                farm = {}

                async def farm_task():
                    farm["status"] = await render_farm(http)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(farm_task)
                    result = await session.call_tool("render_video", {"project_id": "py1"})
                out("render_video", farm_status=farm.get("status"), **result_fields(result))

                cancelled = {}

                async def cancel_task():
                    cancelled["run"], cancelled["status"] = await cancel_cleanup(http)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_task)
                    result = await session.call_tool("render_cleanup", {"project_id": "py2"})
                journal = (
                    await http.get(f"{BASE}/v1/runs/{cancelled['run']}", headers=HEADERS)
                ).json()
                steps = completed_steps(journal)
                out(
                    "render_cleanup",
                    cancel_status=cancelled["status"],
                    steps=steps,
                    status=journal["run"]["status"],
                    **result_fields(result),
                )


anyio.run(main)
