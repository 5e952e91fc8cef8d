"""The official MCP Python SDK driving three of the seed's examples through `eve serve`.

Usage: seed_examples.py http://HOST:PORT   (EVE_MCP_BEARER: an admin key; RENDER_FARM_DIR: where
                                            the served render farm writes its callback URLs)
- progress_then_ask: a blocking call; its ask arrives as elicitation and is answered `approve`.
- render_video: a blocking call; meanwhile the render farm (this script) reads the webhook URL
  the step handed it and POSTs `{status, url}` to it; the call returns the URL.
- render_cleanup: a blocking call; the user cancels the run over HTTP (cancellation of a
  blocking call has no MCP counterpart but task mode's `tasks/cancel`); the call ends with an
  error and the run's journal shows the cleanup step.
- security_review: a blocking call; its `ctx.agent` call to the `reviewer` subagent arrives as
  `sampling/createMessage` (the examples' registry has no Rust agent host), served by this
  script's sampling callback with a JSON review satisfying the call's output schema (read from
  `_meta["eve/outputSchema"]`); the review's findings shape the call's result, and the run's
  journal records the agent call as one input request answered once with the review (wire
  mode: `InputRequested` / `InputAnswered` carrying the call and its reply).
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
sampled = []

SCHEMA = "eve/outputSchema"
RUN = "eve/runId"
TARGET = "eve/target"
AGENT_KEY = "eve/agentKey"


def value_for(schema, text):
    """A JSON value satisfying the (simple) JSON schema `schema`: every property an object
    schema lists, `true` for booleans, one string for arrays of strings, `text` for strings."""
    kind = schema.get("type")
    if kind == "object":
        return {k: value_for(v, text) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [value_for(schema.get("items", {"type": "string"}), text)]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return 1
    return text


async def review(context, params):
    """The `reviewer` subagent: approves the plan, its finding naming the plan it read."""
    meta = params.meta or {}
    plan = params.messages[0].content.text.strip().splitlines()[-1]
    sampled.append(
        {
            "target": meta.get(TARGET),
            "key": meta.get(AGENT_KEY),
            "run": meta.get(RUN),
            "schema": meta.get(SCHEMA),
            "system": params.system_prompt,
            "message": params.messages[0].content.text,
        }
    )
    if meta.get(TARGET) != "reviewer" or SCHEMA not in meta:
        return types.ErrorData(code=-32602, message=f"no subagent serves {meta.get(TARGET)!r}")
    verdict = value_for(meta[SCHEMA], f"reviewed: {plan}")
    missing = [k for k in meta[SCHEMA].get("required", []) if k not in verdict]
    assert not missing, missing
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=json.dumps(verdict)),
        model="python-reviewer",
    )


async def elicit(context, params):
    options = [o["const"] for o in params.requested_schema["properties"]["option"]["oneOf"]]
    asked.append({"message": params.message, "options": options})
    return types.ElicitResult(action="accept", content={"option": "approve"})


def out(example, **fields):
    print(json.dumps({"example": example, **fields}), flush=True)


def event_kinds(journal, kind):
    """The journal's events of `kind` (events are externally tagged)."""
    return [
        e["event"][kind]
        for e in journal["events"]
        if isinstance(e["event"], dict) and kind in e["event"]
    ]


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
        async with ClientSession(
            read, write, elicitation_callback=elicit, sampling_callback=review
        ) as session:
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

                asked.clear()
                result = await session.call_tool("security_review", {"service": "billing"})
                run = sampled[0]["run"] if sampled else None
                journal = (await http.get(f"{BASE}/v1/runs/{run}", headers=HEADERS)).json()
                out(
                    "security_review",
                    sampled=sampled,
                    asked=asked,
                    agent_requests=[
                        e["request"]["agent"]
                        for e in event_kinds(journal, "InputRequested")
                        if e["request"].get("agent")
                    ],
                    agent_results=[
                        e["response"]["agent"]
                        for e in event_kinds(journal, "InputAnswered")
                        if e["response"].get("agent")
                    ],
                    host_agent_events=event_kinds(journal, "AgentCompleted")
                    + event_kinds(journal, "AgentFailed"),
                    steps=completed_steps(journal),
                    status=journal["run"]["status"],
                    **result_fields(result),
                )


anyio.run(main)
