"""Checks eve-server's OpenAPI description against the live server (run by server/tests/openapi.rs).

Environment: EVE_BASE (the server's URL), EVE_KEY (an admin key), EVE_WEBHOOK (the path of a
webhook whose run collects three deliveries).

1. Fetches GET /v1/openapi.json without a key and validates it with openapi-spec-validator.
2. Drives every route of the server (tools, calls, the session channel, requests and answers,
   tasks, runs and their operator actions, sessions, keys, the page's sign-in, webhooks,
   metrics, health, the page) through the successes and the typed errors, and validates each
   answer (status, content type, body) against the description with openapi-core, and each
   request the server accepted (parameters, body, key) too.
3. Fails unless every documented operation was called; prints one JSON summary line last.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from openapi_core import Config, OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.deserializing.media_types.util import plain_loads
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from werkzeug.datastructures import Headers, ImmutableMultiDict

BASE = os.environ["EVE_BASE"].rstrip("/")
KEY = os.environ["EVE_KEY"]
WEBHOOK = os.environ["EVE_WEBHOOK"]
DEADLINE = 60.0

called = set()  # (method, path template) of every validated answer
answers = 0


class Request:
    """openapi-core's Request protocol over what urllib sent."""

    def __init__(self, method, url, headers, body):
        parts = urllib.parse.urlsplit(url)
        self.host_url = f"{parts.scheme}://{parts.netloc}"
        self.path = parts.path
        self.method = method.lower()
        self.body = body
        self.content_type = headers.get("content-type", "application/json" if body else "")
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(urllib.parse.parse_qsl(parts.query)),
            header=Headers(list(headers.items())),
            cookie=ImmutableMultiDict(),
        )


class Response:
    """openapi-core's Response protocol over what urllib received."""

    def __init__(self, status, headers, data):
        self.status_code = status
        self.headers = Headers(list(headers.items()))
        self.content_type = (headers.get("content-type") or "").lower()
        self.data = data


def call(method, path, body=None, key=KEY, headers=None, expect=None, raw=None, sse=False):
    """Sends a request, validates the answer against the description, checks `expect`, and
    returns (status, parsed JSON body or text). `raw` sends bytes as they are; `sse` reads the
    stream up to its first event with data, then closes it."""
    url = BASE + path
    hdrs = dict(headers or {})
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("content-type", "application/json")
    if key:
        hdrs["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        resp = urllib.request.urlopen(req, timeout=DEADLINE)
    except urllib.error.HTTPError as e:
        resp = e
    status = resp.status if hasattr(resp, "status") else resp.code
    rheaders = {k.lower(): v for k, v in resp.headers.items()}
    if sse:
        chunks = b""
        while b"\ndata:" not in chunks or not chunks.endswith(b"\n\n"):
            line = resp.readline()
            if not line:
                break
            chunks += line
        resp.close()
        payload = chunks
    else:
        payload = resp.read()
    lower = {k.lower(): v for k, v in hdrs.items()}
    result = openapi.unmarshal_response(Request(method, url, lower, data), Response(status, rheaders, payload))
    if result.errors:
        why = "; ".join(f"{e!r} because {e.__cause__!r}" for e in result.errors)
        raise AssertionError(f"{method} {path} -> {status}: the answer does not match the description: {why}\n{payload[:2000]!r}")
    if 200 <= status < 300:
        # What was accepted was a request the description allows (parameters, body, key).
        sent = openapi.unmarshal_request(Request(method, url, lower, data))
        if sent.errors:
            why = "; ".join(f"{e!r} because {e.__cause__!r}" for e in sent.errors)
            raise AssertionError(f"{method} {path} was accepted but the description does not allow the request: {why}")
    template = find_template(method, urllib.parse.urlsplit(url).path)
    called.add((method.lower(), template))
    global answers
    answers += 1
    if expect is not None and status != expect:
        raise AssertionError(f"{method} {path}: expected {expect}, got {status}: {payload[:2000]!r}")
    text = payload.decode("utf-8", "replace")
    if sse:
        for line in text.splitlines():
            if line.startswith("data:"):
                session_entry.validate(json.loads(line[len("data:"):]))
    parsed = json.loads(text) if rheaders.get("content-type", "").startswith("application/json") else text
    print(json.dumps({"call": f"{method} {path}", "status": status}), flush=True)
    return status, parsed


def find_template(method, path):
    for template, item in spec["paths"].items():
        if method.lower() not in item:
            continue
        t, p = template.strip("/").split("/"), path.strip("/").split("/")
        if len(t) == len(p) and all(a == b or (a.startswith("{") and a.endswith("}")) for a, b in zip(t, p)):
            return template
    raise AssertionError(f"{method} {path} matches no documented path")


def until(what, probe):
    """Re-reads `probe()` until it returns something truthy (a run state the server does not
    notify over HTTP, such as blocked), for at most DEADLINE seconds."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(w.title() for w in rest)


def get(obj, snake):
    """A field of an answer: the wire names every field in camelCase (`run_id` is `runId`)."""
    return obj[camel(snake)]


def run_status(run_id):
    return call("GET", f"/v1/runs/{run_id}", expect=200)[1]["run"]["status"]


# 1. The document, without a key, valid OpenAPI 3.1.
with urllib.request.urlopen(BASE + "/v1/openapi.json", timeout=DEADLINE) as r:
    spec = json.loads(r.read())
validate(spec)
# The text media types the description uses beside JSON, read as text.
TEXT = {m: plain_loads for m in ("text/event-stream", "text/html", "application/openmetrics-text")}
openapi = OpenAPI.from_dict(spec, config=Config(extra_media_type_deserializers=TEXT))
# OpenAPI 3.1 cannot type an SSE stream's events: each `data:` is checked against SessionEntry here.
session_entry = OAS31Validator({"$ref": "#/components/schemas/SessionEntry", "components": spec["components"]})
assert spec["openapi"].startswith("3.1"), spec["openapi"]
call("GET", "/v1/openapi.json", key=None, expect=200)
print(json.dumps({"step": "document valid", "paths": len(spec["paths"])}), flush=True)

# 2. Health, the page, signing in and out.
call("GET", "/healthz", key=None, expect=200)
call("GET", "/readyz", key=None, expect=200)
call("GET", "/?session=py", key=None, expect=200)
# The page's deep links serve the same page.
for page in ("/requests", "/runs", "/runs/run-x", "/sessions", "/sessions/py", "/keys"):
    call("GET", page, key=None, expect=200)
call("GET", "/v1/auth/session", expect=200)
call("GET", "/v1/auth/session", key=None, expect=401)
call("POST", "/v1/auth/session", body={"key": KEY}, key=None, expect=200)
call("POST", "/v1/auth/session", body={"key": "eve_000000000000_" + "0" * 64}, key=None, expect=401)
call("POST", "/v1/auth/session", body=["not", "an", "object"], key=None, expect=400)
call("DELETE", "/v1/auth/session", key=None, expect=204)

# Keys: create, list, revoke; a revoked key and one of too small a scope.
_, created = call("POST", "/v1/keys", body={"name": "reader", "scope": "read"}, expect=201)
reader = created["key"]
call("POST", "/v1/keys", body={"name": "x", "scope": "root"}, expect=400)
_, listed = call("GET", "/v1/keys", expect=200)
assert any(k["id"] == created["record"]["id"] for k in listed["keys"]), listed
# The key the test made to expire: its expiry is listed (and described) as `expiresAt`.
assert any(isinstance(k.get("expiresAt"), int) for k in listed["keys"]), listed
call("GET", "/v1/runs", key=reader, expect=200)
call("POST", "/v1/keys", body={"name": "y", "scope": "read"}, key=reader, expect=403)
call("POST", f"/v1/keys/{created['record']['id']}/revoke", expect=200)
call("POST", "/v1/keys/000000000000/revoke", expect=404)
call("GET", "/v1/runs", key=reader, expect=401)
call("GET", "/v1/runs", key=None, expect=401)

# 3. Tools and calls: a default-execution call that asks, answered.
_, tools = call("GET", "/v1/tools", expect=200)
assert "deploy" in [t["name"] for t in tools["tools"]], tools
CALL_ID = "callId"
# An ordinary tool runs inline: 200, no run, settled at once; its input is checked the same way.
_, inline = call("POST", "/v1/tools/lookup_order/calls", body={"session": "py", CALL_ID: "lookup-1", "input": {"order_id": "o-1"}}, expect=200)
assert inline["run"] is None and inline["settled"]["status"] == "completed", inline
assert inline["settled"]["output"] == {"order": "o-1", "status": "shipped"}, inline
_, inline = call("POST", "/v1/tools/lookup_order/calls", body={"session": "py", CALL_ID: "lookup-2", "input": {"order_id": "missing"}}, expect=200)
assert inline["settled"]["status"] == "failed" and "missing" in inline["settled"]["error"], inline
_, bad = call("POST", "/v1/tools/lookup_order/calls", body={"session": "py", CALL_ID: "lookup-3", "input": {"order": 1}}, expect=400)
assert bad["code"] == "invalid_input" and "order_id" in bad["message"], bad
_, bad = call("POST", "/v1/tools/lookup_order/calls", body={"session": "py", CALL_ID: "lookup-4", "input": {"order_id": 7}}, expect=400)
assert "order_id: expected a string, got the number 7" in bad["message"], bad
start = {"session": "py", CALL_ID: "deploy-1", "input": {"service": "api"}}
_, started = call("POST", "/v1/tools/deploy/calls", body=start, expect=201)
deploy_run = get(started["run"], "run_id")
call("POST", "/v1/tools/deploy/calls", body=start, expect=200)
call("POST", "/v1/tools/deploy/calls", body={**start, "input": {"service": "db"}}, expect=409)
call("POST", "/v1/tools/nope/calls", body=start, expect=404)
call("POST", "/v1/tools/deploy/calls", body={**start, CALL_ID: "deploy-bad", "input": {"service": 7}}, expect=400)
call("POST", "/v1/tools/deploy/calls?wait=soon", body=start, expect=400)
# Ids a client chooses are checked before anything is read or written: 400 `invalid_id`.
_, bad = call("POST", "/v1/tools/deploy/calls", body={**start, "session": "a\nb"}, expect=400)
assert bad["code"] == "invalid_id", bad
_, bad = call("GET", "/v1/sessions/" + "s" * 300 + "/requests", expect=400)
assert bad["code"] == "invalid_id", bad
_, bad = call("GET", "/v1/runs?session=" + "s" * 300, expect=400)
assert bad["code"] == "invalid_id", bad

# The request arrives on the session's stream (no polling), then in both listings.
_, first = call("GET", "/v1/sessions/py/events", sse=True, expect=200)
assert "event:" in first, first
_, first_many = call("GET", "/v1/events?session=py&session=other", sse=True, expect=200)
assert "data:" in first_many, first_many
call("GET", "/v1/events", expect=400)
assert "input.requested" in first, first
_, pending = call("GET", "/v1/sessions/py/requests", expect=200)
requests = [p for p in pending["requests"] if get(p, "run_id") == deploy_run]
request_id = get(requests[0], "request_id")
_, page = call("GET", "/v1/requests?limit=10&order=oldest", expect=200)
assert any(get(r, "request_id") == request_id and r["tool"] == "deploy" for r in page["requests"]), page
call("GET", "/v1/requests?limit=0", expect=400)
# An answer link for the request: minted with a key, then used with none.
_, link = call("POST", f"/v1/requests/{request_id}/links", body={"expiresIn": "1h"}, expect=201)
token = link["url"].rsplit("/", 1)[1]
call("POST", "/v1/requests/req-none/links", body={}, expect=404)
call("POST", f"/v1/requests/{request_id}/links", body={"expiresIn": "soon"}, expect=400)
_, shown = call("GET", f"/v1/links/{token}", key=None, expect=200)
_, html = call("GET", f"/answer/{token}", key=None, expect=200)
call("GET", "/v1/links/evl_000000000000_" + "0" * 64, key=None, expect=404)
call("POST", f"/v1/links/{token}/answer", body={"optionId": "nope"}, key=None, expect=422)
call("POST", f"/v1/requests/{request_id}/answer", body={"optionId": "nope"}, expect=422)
_, answered = call("POST", f"/v1/requests/{request_id}/answer", body={"optionId": "approve"}, expect=200)
# Answered elsewhere: the link opens nothing any more.
call("POST", f"/v1/links/{token}/answer", body={"optionId": "approve"}, key=None, expect=410)
assert answered["duplicate"] is False, answered
_, again = call("POST", f"/v1/requests/{request_id}/answer", body={"optionId": "approve"}, expect=200)
assert again["duplicate"] is True, again
call("POST", f"/v1/requests/{request_id}/answer", body={"optionId": "cancel"}, expect=409)
call("POST", "/v1/requests/req-none/answer", body={"optionId": "approve"}, expect=404)
call("POST", f"/v1/requests/{request_id}/answer", raw=b"[1]", headers={"content-type": "application/json"}, expect=400)
# The retry long-polls until the call settles, and says how.
_, settled = call("POST", "/v1/tools/deploy/calls?wait=30s", body=start, expect=200)
assert settled["settled"]["status"] == "completed", settled
assert settled["settled"]["output"]["deployed"] is True, settled

# A subagent call the host serves over HTTP (the registry has no AgentHost): listed by
# /v1/agents (not /v1/requests), its result refused when it does not match the schema, then
# recorded once; a call whose run was cancelled is withdrawn.
def agent_calls(session):
    return call("GET", f"/v1/agents?session={session}&limit=10&order=oldest", expect=200)[1]["agents"]


delegate = {"session": "py-agents", CALL_ID: "delegate-1", "input": {"topic": "tides"}}
call("POST", "/v1/tools/delegate/calls", body=delegate, expect=201)
agent_id = get(until("the agent call to be listed", lambda: agent_calls("py-agents"))[0], "request_id")
_, asks = call("GET", "/v1/requests?session=py-agents", expect=200)
assert asks["requests"] == [], asks
call("GET", "/v1/agents?limit=0", expect=400)
_, bad = call("POST", f"/v1/agents/{agent_id}/result", body={"output": {"facts": [7]}}, expect=422)
assert "/facts/0" in bad["message"], bad
call("POST", f"/v1/agents/{agent_id}/result", body={}, expect=400)
call("POST", "/v1/agents/none:1/result", body={"output": {}}, expect=404)
_, done = call("POST", f"/v1/agents/{agent_id}/result", body={"output": {"facts": ["two a day"]}}, expect=200)
assert done["duplicate"] is False, done
_, again = call("POST", f"/v1/agents/{agent_id}/result", body={"output": {"facts": ["two a day"]}}, expect=200)
assert again["duplicate"] is True, again
call("POST", f"/v1/agents/{agent_id}/result", body={"error": "changed my mind"}, expect=409)
_, withdrawn = call("POST", "/v1/tools/delegate/calls", body={**delegate, CALL_ID: "delegate-2"}, expect=201)
withdrawn_run = get(withdrawn["run"], "run_id")
until("the second agent call to be listed", lambda: agent_calls("py-agents"))
withdrawn_id = get(agent_calls("py-agents")[0], "request_id")
call("POST", f"/v1/runs/{withdrawn_run}/cancel", expect=202)
until("the delegating run to end cancelled", lambda: run_status(withdrawn_run) == "cancelled")
call("POST", f"/v1/agents/{withdrawn_id}/result", body={"error": "too late"}, expect=410)

# A task: listed, cancelled, cancelled again; a default call is not a task.
_, task = call("POST", "/v1/tools/refund_order/calls", body={"session": "py", CALL_ID: "refund-1", "input": {"order_id": "o-1"}}, expect=201)
task_id = get(task["run"], "run_id")
# A background start answers the seed's receipt beside the run.
assert task["status"] == "working" and task["taskId"] == task_id, task
_, tasks = call("GET", "/v1/sessions/py/tasks", expect=200)
assert [get(t, "task_id") for t in tasks["tasks"]] == [task_id], tasks
call("POST", f"/v1/tasks/{task_id}/cancel", expect=202)
call("POST", f"/v1/tasks/{task_id}/cancel", expect=200)
call("POST", f"/v1/tasks/{deploy_run}/cancel", expect=409)
call("POST", "/v1/tasks/run-none/cancel", expect=404)

# Turns: a message to an idle session is delivered; while a call is parked it is queued, or it
# steers (the call is cancelled); the turn then delivers both. The session's task_cancel.
_, out = call("POST", "/v1/sessions/py-turns/messages", body={"message": "hi"}, expect=200)
assert out["outcome"] == "delivered" and out["messages"][0]["message"] == "hi", out
call("POST", "/v1/sessions/py-turns/messages", body={"message": "hi", "policy": "later"}, expect=400)
_, parked = call("POST", "/v1/tools/deploy/calls", body={"session": "py-turns", CALL_ID: "deploy-t", "input": {"service": "api"}}, expect=201)
parked_run = get(parked["run"], "run_id")
_, out = call("POST", "/v1/sessions/py-turns/messages", body={"message": "wait", "policy": "queue"}, expect=200)
assert out["outcome"] == "queued" and out["waitingOn"] == ["deploy-t"], out
call("GET", "/v1/sessions/py-turns/turn?wait=0s", expect=204)
call("GET", "/v1/sessions/py-turns/turn?wait=soon", expect=400)
_, out = call("POST", "/v1/sessions/py-turns/messages", body={"message": "stop", "policy": "steer"}, expect=200)
assert out["outcome"] == "steered" and out["cancelled"] == [parked_run], out
_, turn = call("GET", "/v1/sessions/py-turns/turn?wait=30s&from=0", expect=200)
assert [m["message"] for m in turn["messages"]] == ["wait", "stop"], turn
assert isinstance(turn["nextSeq"], int), turn
_, task = call("POST", "/v1/tools/refund_order/calls", body={"session": "py-turns", CALL_ID: "refund-t", "input": {"order_id": "o-2"}}, expect=201)
task_t = get(task["run"], "run_id")
call("POST", f"/v1/sessions/py-turns/tasks/{parked_run}/cancel", expect=409)
call("POST", "/v1/sessions/py-turns/tasks/run-none/cancel", expect=404)
call("POST", f"/v1/sessions/py-turns/tasks/{task_t}/cancel", expect=202)
call("POST", f"/v1/sessions/py-turns/tasks/{task_t}/cancel", expect=200)

# Runs: a blocked run resumed, blocked again, failed; cancels of live and ended runs.
_, broken = call("POST", "/v1/tools/broken/calls", body={"session": "ops", CALL_ID: "broken-1", "input": {"service": "api"}}, expect=201)
broken_run = get(broken["run"], "run_id")
until("the broken run to block", lambda: run_status(broken_run) == "blocked")
call("POST", f"/v1/runs/{broken_run}/fail", body={}, expect=400)
_, resumed = call("POST", f"/v1/runs/{broken_run}/resume", expect=200)
assert isinstance(resumed["seq"], int), resumed
until("the broken run to block again", lambda: run_status(broken_run) == "blocked")
call("POST", f"/v1/runs/{broken_run}/fail", body={"error": "the fix is not deployed yet"}, expect=200)
call("POST", f"/v1/runs/{broken_run}/resume", expect=400)
_, live = call("POST", "/v1/tools/deploy/calls", body={"session": "ops", CALL_ID: "deploy-2", "input": {"service": "web"}}, expect=201)
call("POST", f"/v1/runs/{get(live['run'], 'run_id')}/cancel", body={"reason": "not today"}, expect=202)
call("POST", f"/v1/runs/{deploy_run}/cancel", expect=200)
call("POST", "/v1/runs/run-none/cancel", expect=404)
# Terminate: a reason is required; a live run ends at once; an ended run is refused naming its status.
_, doomed = call("POST", "/v1/tools/deploy/calls", body={"session": "ops", CALL_ID: "deploy-5", "input": {"service": "queue"}}, expect=201)
doomed_run = get(doomed["run"], "run_id")
call("POST", f"/v1/runs/{doomed_run}/terminate", body={}, expect=400)
_, terminated = call("POST", f"/v1/runs/{doomed_run}/terminate", body={"reason": "stuck deploy"}, expect=200)
assert isinstance(terminated["seq"], int), terminated
assert run_status(doomed_run) == "failed", run_status(doomed_run)
_, refused = call("POST", f"/v1/runs/{doomed_run}/terminate", body={"reason": "again"}, expect=409)
assert refused["code"] == "not_live" and "failed" in refused["message"], refused
call("POST", "/v1/runs/run-none/terminate", body={"reason": "none"}, expect=404)
# Retry and reset: a live run is refused (terminate or cancel it first); a bad cut is a 400; a
# retry of the terminated run starts a new run linked to it; the same cut again answers it (200).
_, alive = call("POST", "/v1/tools/deploy/calls", body={"session": "ops", CALL_ID: "deploy-6", "input": {"service": "cache"}}, expect=201)
alive_run = get(alive["run"], "run_id")
_, refused = call("POST", f"/v1/runs/{alive_run}/reset", body={"to": 1}, expect=409)
assert refused["code"] == "not_ended" and "terminate" in refused["message"], refused
call("POST", f"/v1/runs/{alive_run}/retry", expect=409)
call("POST", f"/v1/runs/{doomed_run}/reset", body={"to": 999}, expect=400)
call("POST", f"/v1/runs/{doomed_run}/reset", body={}, expect=400)
_, retried = call("POST", f"/v1/runs/{doomed_run}/retry", body={}, expect=201)
assert retried["created"] is True and retried["from"]["run"] == doomed_run, retried
_, again = call("POST", f"/v1/runs/{doomed_run}/reset", body={"to": retried["from"]["seq"]}, expect=200)
assert again["created"] is False and again["run"]["runId"] == retried["run"]["runId"], again
call("POST", "/v1/runs/run-none/retry", expect=404)
call("POST", "/v1/runs/run-none/reset", body={"to": 1}, expect=404)
_, runs = call("GET", "/v1/runs?limit=50&order=newest", expect=200)
assert any(r.get("outcome", {}).get("kind") == "failed" for r in runs["runs"]), runs
call("GET", "/v1/runs", expect=200)
call("GET", "/v1/runs?status=sleeping", expect=400)
call("GET", f"/v1/runs?before=run-none", expect=400)
# Search on input fields (and attributes, none set by these bodies).
_, found = call("GET", "/v1/runs?query=" + urllib.parse.quote('input.service = "api"'), expect=200)
assert deploy_run in [get(r, "run_id") for r in found["runs"]], found
_, found = call("GET", "/v1/runs?query=" + urllib.parse.quote('attr.region = "eu"'), expect=200)
assert found["runs"] == [], found
_, bad = call("GET", "/v1/runs?query=" + urllib.parse.quote("service = api"), expect=400)
assert bad["code"] == "invalid_query", bad
_, journal = call("GET", f"/v1/runs/{deploy_run}", expect=200)
assert len(journal["events"]) > 4, journal
call("GET", f"/v1/runs/{broken_run}", expect=200)
call("GET", "/v1/runs/run-none", expect=404)

# Sessions: a record, an end that cancels what is live.
call("POST", "/v1/tools/deploy/calls", body={"session": "ending", CALL_ID: "deploy-3", "input": {"service": "cache"}}, expect=201)
_, ended = call("POST", "/v1/sessions/ending/end", expect=200)
assert len(ended["cancelled"]) == 1, ended
call("POST", "/v1/tools/deploy/calls", body={"session": "ending", CALL_ID: "deploy-4", "input": {"service": "cache"}}, expect=409)
_, late = call("POST", "/v1/sessions/ending/messages", body={"message": "late"}, expect=409)
assert late["code"] == "session_ended", late
call("GET", "/v1/sessions/ending", expect=200)
call("GET", "/v1/sessions/py", expect=200)

# Webhooks: each method, a retried Idempotency-Key, the refusals.
call("POST", WEBHOOK, body={"status": "ok"}, key=None, headers={"idempotency-key": "py-1"}, expect=202)
call("POST", WEBHOOK, body={"status": "ok"}, key=None, headers={"idempotency-key": "py-1"}, expect=202)
_, mismatch = call("POST", WEBHOOK, body={"status": "changed"}, key=None, headers={"idempotency-key": "py-1"}, expect=409)
assert mismatch["code"] == "idempotency_mismatch", mismatch
call("PUT", WEBHOOK, raw=b"plain text", key=None, headers={"content-type": "text/plain"}, expect=202)
call("PATCH", WEBHOOK, body={"n": 3}, key=None, expect=202)
call("POST", WEBHOOK, raw=b"{not json", key=None, headers={"content-type": "application/json"}, expect=400)
call("POST", "/.well-known/workflow/v1/webhook/wh_" + "0" * 32, body={}, key=None, expect=404)

# Hooks a workflow made with its own token: resumed once per Idempotency-Key (operate key).
call("POST", "/v1/tools/await_hook/calls", body={"session": "py-hooks", CALL_ID: "hook-1", "input": {"token": "py-hook", "count": 2}}, expect=201)
_, delivered = until("the hook to be created", lambda: (lambda r: r[0] == 200 and r)(call("POST", "/v1/hooks/py-hook", body={"frame": 1}, headers={"idempotency-key": "py-h1"})))
assert delivered["duplicate"] is False and delivered["token"] == "py-hook", delivered
_, again = call("POST", "/v1/hooks/py-hook", body={"frame": 1}, headers={"idempotency-key": "py-h1"}, expect=200)
assert again["duplicate"] is True and again["seq"] == delivered["seq"], again
_, mismatch = call("POST", "/v1/hooks/py-hook", body={"frame": 2}, headers={"idempotency-key": "py-h1"}, expect=409)
assert mismatch["code"] == "idempotency_mismatch", mismatch
call("POST", "/v1/hooks/py-hook", raw=b"{not json", headers={"content-type": "application/json"}, expect=400)
call("POST", "/v1/hooks/py-hook", body=1, key=reader, expect=401)
call("POST", "/v1/hooks/nobody-made-this", body=1, expect=404)
call("POST", "/v1/hooks/py-hook", body="done", expect=200)

call("GET", "/metrics", expect=200)

# 3. Every documented operation was called.
documented = {(m, p) for p, item in spec["paths"].items() for m in item if m in ("get", "post", "put", "patch", "delete")}
missing = sorted(documented - called)
if missing:
    raise AssertionError(f"documented operations this check never called: {missing}")
print(json.dumps({"valid": True, "operations": len(called), "responses": answers}), flush=True)
