"""The official MCP Python SDK driving the rest of the seed's examples through `eve serve`.

Usage: seed_examples_more.py http://HOST:PORT
  (EVE_MCP_BEARER: an admin key; EVE_BIN: the `eve` binary; EVE_DIR: the directory `eve serve`
   runs in, whose default store `sqlite://eve.db` `eve hook resume` opens)

Two MCP sessions: one without the tasks extension (every call blocks; asks arrive as
elicitation), one that declares `io.modelcontextprotocol/tasks` (every call answers a task at
once; the script polls `tasks/get` and answers asks with `tasks/update`). The SDK's typed
`call_tool` validates a `tools/call` result as a `CallToolResult` at the 2025-11-25 handshake,
so the task session sends its requests through the SDK session's JSON-RPC dispatcher.

- remind (background): blocking with `delay: "1s"` (a background tool answers its receipt at
  once; its end is pushed as `notifications/message`); then task mode, polled to completion.
- remind_with_progress (background): blocking (the receipt, then the pushed end); then task mode,
  whose journal shows the posted message.
- deploy_approval: blocking; its ask is answered `approve` through elicitation.
- deploy_deadline: blocking, answered `approve` through elicitation (no deadline fires); blocking
  with a first deadline of "1s", answered `approve` only once the run paged on-call (the same
  ask, answered after the escalation); then task mode with both deadlines at "1s", left unanswered: it pages on-call and times out.
- refund_order (background): blocking: the receipt, then the pushed notice of its ask (request id,
  where to answer), answered `approve` over HTTP, then the pushed end (refunded); then task
  mode, its ask read from `tasks/get` (`input_required`) and answered `deny` by `tasks/update`.
- deploy (hook version): blocking; meanwhile the approver waits for the run's hook and delivers
  `{"option_id": "approve"}` with `eve hook resume approve-web` (a caller-chosen hook token has
  no HTTP route: only webhooks do); then task mode with both deadlines at "1s": timed out.
- render_hook: blocking; the render farm waits for the hook and delivers `{status, url}` with
  `eve hook resume render-py3`.
Prints one JSON line per example and mode for the Rust test to assert on.
"""

import json
import os
import subprocess
import sys

import anyio
import httpx2 as httpx
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BASE = sys.argv[1]
KEY = os.environ["EVE_MCP_BEARER"]
EVE_BIN = os.environ["EVE_BIN"]
EVE_DIR = os.environ["EVE_DIR"]
HEADERS = {"Authorization": f"Bearer {KEY}"}
TASKS = "io.modelcontextprotocol/tasks"
asked = []
shared = {}
# The notifications/message data eve pushed (notices, task ends).
logs = []


async def on_log(params):
    logs.append(params.data)


async def pushed(task, kind):
    """Waits for eve's pushed `notifications/message` of `kind` about `task`."""

    async def found():
        return next(
            (d for d in logs if isinstance(d, dict) and d.get("taskId") == task and d.get("kind") == kind),
            None,
        )

    return await until(found, f"{kind} of {task}")


async def elicit(context, params):
    options = [o["const"] for o in params.requested_schema["properties"]["option"]["oneOf"]]
    asked.append({"message": params.message, "options": options})
    if params.message == "Deploy esc?":
        # The approver answers late: once the first deadline passed and on-call was paged.
        shared["paged"] = await paged(shared["http"], "deploy_deadline")
    return types.ElicitResult(action="accept", content={"option": "approve"})


async def paged(http, tool):
    """Waits until a running run of `tool` completed its page_on_call step; its run id."""

    async def found():
        r = await http.get(f"{BASE}/v1/runs", params={"tool": tool}, headers=HEADERS)
        for run in r.json()["runs"]:
            if run["status"] == "running":
                if "page_on_call" in completed_steps(await journal(http, run["runId"])):
                    return run["runId"]
        return None

    return await until(found, "the page")


def out(example, mode, **fields):
    print(json.dumps({"example": example, "mode": mode, **fields}), flush=True)


def result_fields(result):
    return {
        "is_error": result.is_error,
        "structured": result.structured_content,
        "text": [c.text for c in result.content if c.type == "text"],
    }


def events(journal, kind):
    """The journal's events of one kind (events are externally tagged)."""
    return [
        e["event"][kind]
        for e in journal["events"]
        if isinstance(e["event"], dict) and kind in e["event"]
    ]


def completed_steps(journal):
    return [e["name"] for e in events(journal, "StepCompleted")]


async def until(check, what):
    with anyio.fail_after(60):
        while True:
            found = await check()
            if found is not None:
                return found
            await anyio.sleep(0.05)


async def journal(http, run):
    r = await http.get(f"{BASE}/v1/runs/{run}", headers=HEADERS)
    r.raise_for_status()
    return r.json()


async def deliver_hook(http, tool, token, payload):
    """Waits until a run of `tool` created the hook `token`, then delivers `payload` to it."""

    async def created():
        r = await http.get(f"{BASE}/v1/runs", params={"tool": tool}, headers=HEADERS)
        for run in r.json()["runs"]:
            if run["status"] != "running":
                continue
            j = await journal(http, run["runId"])
            if any(h["token"] == token for h in events(j, "HookCreated")):
                return run["runId"]
        return None

    run = await until(created, f"the hook {token}")
    done = await anyio.run_process(
        [EVE_BIN, "hook", "resume", token, json.dumps(payload)], cwd=EVE_DIR, check=False
    )
    return run, done.returncode, done.stdout.decode()


async def blocking_with_hook(session, http, tool, arguments, token, payload):
    delivered = {}

    async def deliver():
        delivered["run"], delivered["rc"], delivered["out"] = await deliver_hook(
            http, tool, token, payload
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(deliver)
        result = await session.call_tool(tool, arguments)
    return delivered, result


async def raw(session, method, params):
    return await session._dispatcher.send_raw_request(method, params, {})


async def task_until(session, task_id, statuses):
    async def settled():
        t = await raw(session, "tasks/get", {"taskId": task_id})
        return t if t["status"] in statuses else None

    return await until(settled, f"task {task_id} in {statuses}")


async def task_call(session, tool, arguments):
    """Task mode: the receipt, then `tasks/get` until the task ends."""
    receipt = await raw(session, "tools/call", {"name": tool, "arguments": arguments})
    done = await task_until(session, receipt["taskId"], {"completed", "failed", "cancelled"})
    return receipt, done


def task_fields(receipt, done):
    result = done.get("result") or {}
    return {
        "receipt_type": receipt["resultType"],
        "receipt_status": receipt["status"],
        "task_id": receipt["taskId"],
        "status": done["status"],
        "is_error": result.get("isError"),
        "structured": result.get("structuredContent"),
    }


async def blocking(session, http):
    result = await session.call_tool("remind", {"note": "tea", "delay": "1s"})
    ended = await pushed(result.structured_content["taskId"], "task.completed")
    out("remind", "blocking", ended=ended, **result_fields(result))

    result = await session.call_tool("remind_with_progress", {"note": "stretch", "delay": "1s"})
    ended = await pushed(result.structured_content["taskId"], "task.completed")
    out("remind_with_progress", "blocking", ended=ended, **result_fields(result))

    asked.clear()
    result = await session.call_tool("deploy_approval", {"service": "api"})
    out("deploy_approval", "blocking", asked=list(asked), **result_fields(result))

    asked.clear()
    result = await session.call_tool("deploy_deadline", {"service": "db"})
    out("deploy_deadline", "blocking", asked=list(asked), **result_fields(result))

    asked.clear()
    result = await session.call_tool(
        "deploy_deadline", {"service": "esc", "first_deadline": "1s", "second_deadline": "1h"}
    )
    j = await journal(http, shared["paged"])
    out(
        "deploy_deadline",
        "escalated",
        asked=list(asked),
        steps=completed_steps(j),
        **result_fields(result),
    )

    result = await session.call_tool("refund_order", {"order_id": "o1", "amount": 12.5})
    task = result.structured_content["taskId"]
    notice = await pushed(task, "input.requested")
    r = await http.post(
        f"{BASE}/v1/requests/{notice['requestId']}/answer", json={"optionId": "approve"}, headers=HEADERS
    )
    r.raise_for_status()
    ended = await pushed(task, "task.completed")
    out("refund_order", "blocking", notice=notice["message"], ended=ended, **result_fields(result))

    delivered, result = await blocking_with_hook(
        session, http, "deploy", {"service": "web"}, "approve-web", {"option_id": "approve"}
    )
    j = await journal(http, delivered["run"])
    out(
        "deploy",
        "blocking",
        hook_rc=delivered["rc"],
        hook_out=delivered["out"],
        steps=completed_steps(j),
        **result_fields(result),
    )

    delivered, result = await blocking_with_hook(
        session,
        http,
        "render_hook",
        {"project_id": "py3"},
        "render-py3",
        {"status": "ok", "url": "https://cdn.example/py3.mp4"},
    )
    out(
        "render_hook",
        "blocking",
        hook_rc=delivered["rc"],
        hook_out=delivered["out"],
        **result_fields(result),
    )


async def tasks(session, http):
    receipt, done = await task_call(session, "remind", {"note": "tea", "delay": "1s"})
    out("remind", "task", **task_fields(receipt, done))

    receipt, done = await task_call(
        session, "remind_with_progress", {"note": "stretch", "delay": "1s"}
    )
    j = await journal(http, receipt["taskId"])
    messages = [e["message"] for e in events(j, "MessagePosted")]
    out("remind_with_progress", "task", messages=messages, **task_fields(receipt, done))

    receipt, done = await task_call(
        session,
        "deploy_deadline",
        {"service": "slow", "first_deadline": "1s", "second_deadline": "1s"},
    )
    j = await journal(http, receipt["taskId"])
    out(
        "deploy_deadline",
        "task",
        steps=completed_steps(j),
        withdrawn=len(events(j, "InputWithdrawn")),
        **task_fields(receipt, done),
    )

    receipt, done = await task_call(
        session, "deploy", {"service": "late", "first_deadline": "1s", "second_deadline": "1s"}
    )
    j = await journal(http, receipt["taskId"])
    out("deploy", "task", steps=completed_steps(j), **task_fields(receipt, done))

    receipt = await raw(
        session, "tools/call", {"name": "refund_order", "arguments": {"order_id": "o2", "amount": 3}}
    )
    waiting = await task_until(session, receipt["taskId"], {"input_required"})
    (key, request), = waiting["inputRequests"].items()
    schema = request["params"]["requestedSchema"]
    options = [o["const"] for o in schema["properties"]["option"]["oneOf"]]
    await raw(
        session,
        "tasks/update",
        {
            "taskId": receipt["taskId"],
            "inputResponses": {key: {"action": "accept", "content": {"option": "deny"}}},
        },
    )
    done = await task_until(session, receipt["taskId"], {"completed", "failed", "cancelled"})
    out(
        "refund_order",
        "task",
        asked={"message": request["params"]["message"], "options": options},
        **task_fields(receipt, done),
    )


async def main():
    async with httpx.AsyncClient() as http:
        shared["http"] = http
        client = create_mcp_http_client(headers=HEADERS)
        async with streamable_http_client(f"{BASE}/mcp", http_client=client) as (read, write, *_):
            async with ClientSession(
                read, write, elicitation_callback=elicit, logging_callback=on_log
            ) as session:
                await session.initialize()
                await blocking(session, http)
        client = create_mcp_http_client(headers=HEADERS)
        async with streamable_http_client(f"{BASE}/mcp", http_client=client) as (read, write, *_):
            async with ClientSession(read, write, extensions={TASKS: {}}) as session:
                await session.initialize()
                await tasks(session, http)


anyio.run(main)
