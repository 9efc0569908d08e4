"""The MLflow UI as `zhpipe ui` serves it (`mlflow server --app-name zhpipe`): MLflow's own server
app, plus one page, `/zhpipe/open?to=#/...`, that sets the UI's view to machine learning (runs,
metrics, models) in the browser and then opens the page asked for. MLflow 3 keeps its
GenAI/machine-learning toggle in the browser's localStorage (`mlflow.workflowType_v1`) and starts in
GenAI; only a page of the same origin can set it, and from then on every page of the UI opens in the
runs view, links without `?workflowType=` included (and, on a first visit, without the assistant
panel MLflow opens by itself).

Only its owner reaches it: every request must carry the project's credentials (HTTP basic auth, the
same `user:password` the project's Prefect server asks for, kept 0600 in the Prefect home; the
file's path comes in `ZHPIPE_UI_AUTH_FILE`), and it is read-only by allow-list: only MLflow's own
GET routes, the static pages, the few POSTs the UI reads with (searches) and GraphQL queries
(parsed, so no escape hides a mutation) reach MLflow; anything else is refused with 403 before
MLflow sees it, websockets are closed unanswered, and a body over `MAX_BODY` is refused unread
(413). The UI itself only reads."""

from __future__ import annotations

import base64
import hmac
import json
import os
import re

from mlflow.server.fastapi_app import app as mlflow_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

VIEW_KEY, VIEW = "mlflow.workflowType_v1", "machine_learning"
# its assistant panel (an LLM chat) opens by itself on a first visit: closed, unless the user chose
# otherwise before
FIRST_VISIT = {
    "mlflow.assistant.panelOpen_v1": False,
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}
# a route of the UI; anything else opens the experiment list
_TARGET = re.compile(r"#/[A-Za-z0-9/_.?=&%-]*")

PAGE = """<!doctype html><meta charset="utf-8"><title>MLflow (zhpipe)</title>
<script>
try {{
  localStorage.setItem({key}, {value});
  for (const [k, v] of Object.entries({first}))
    if (localStorage.getItem(k) === null) localStorage.setItem(k, JSON.stringify(v));
}} catch (e) {{}}
location.replace("/" + {target});
</script>
<noscript><a href="/{target_plain}">MLflow</a></noscript>"""


def open_page(request: Request) -> HTMLResponse:
    target = request.query_params.get("to", "")
    if not _TARGET.fullmatch(target):
        target = "#/experiments"
    return HTMLResponse(
        PAGE.format(
            key=json.dumps(VIEW_KEY),
            value=json.dumps(json.dumps(VIEW)),
            first=json.dumps(FIRST_VISIT),
            target=json.dumps(target),
            target_plain=target,
        )
    )


# the POSTs the UI reads with (MLflow's search endpoints), under /api or /ajax-api, versions 2.0 and
# 3.0
_READ_POST = re.compile(
    r"/(ajax-)?api/[23]\.0/?mlflow/(experiments/search|runs/search|logged-models/search|"
    r"registered-models/get-latest-versions|datasets/search|traces/search|issues/search|"
    r"experiments/search-datasets)/?"
)
# where MLflow's API lives: a GET there must be one of MLflow's own read routes; elsewhere it is the
# UI's static pages
_API = re.compile(r"/(ajax-api|api|graphql|v1|gateway|jobs)(/|$)")
# the AI gateway's endpoints, which MLflow's pages ask for: answered as MLflow answers with no
# gateway configured (`{"endpoints": []}`), never forwarded (MLflow would forward it to
# MLFLOW_DEPLOYMENTS_TARGET when one is set)
_GATEWAY = re.compile(r"/(ajax-)?api/2\.0/mlflow/gateway-proxy/?")
MAX_BODY = 1 << 20  # the UI's searches and queries are a few kB
AUTH_FILE = "ZHPIPE_UI_AUTH_FILE"


def _credentials() -> bytes | None:
    """The `user:password` the server demands, read from the owner's private file; None when it
    cannot be read (then every request is refused: a server without credentials serves no one)."""
    path = os.environ.get(AUTH_FILE)
    try:
        auth = json.loads(open(path, encoding="utf-8").read()).get("auth_string") if path else None
    except (OSError, ValueError):
        return None
    return auth.encode() if isinstance(auth, str) and ":" in auth else None


def _read_gets() -> re.Pattern:
    """MLflow's own GET routes (from its route table; `<id>` parts match one path segment)."""
    from mlflow.server import handlers

    paths = {
        re.sub(r"<[^>]+>", "\0", p)
        for p, _, methods in handlers.get_endpoints()
        if "GET" in methods
    }
    return re.compile("|".join(re.escape(p).replace("\0", "[^/]+") + "/?" for p in sorted(paths)))


def _only_queries(body: bytes) -> bool:
    """Whether a GraphQL request body (JSON) holds queries only: parsed by GraphQL's own parser,
    after JSON's escapes are decoded, so that no spelling of `mutation` or `subscription` passes."""
    from graphql import GraphQLError, OperationType, parse
    from graphql.language import OperationDefinitionNode

    try:
        payload = json.loads(body)
        queries = [p.get("query") for p in (payload if isinstance(payload, list) else [payload])]
        documents = [parse(q) for q in queries if isinstance(q, str)]
    except (ValueError, AttributeError, GraphQLError):
        return False
    return len(documents) == len(queries) > 0 and all(
        d.operation == OperationType.QUERY
        for doc in documents
        for d in doc.definitions
        if isinstance(d, OperationDefinitionNode)
    )


def is_read(method: str, path: str, body: bytes = b"", gets: re.Pattern | None = None) -> bool:
    """Whether a request is on the allow-list of reads: a GET or HEAD of the static UI or of one of
    MLflow's GET routes, a POST to one of the searches the UI reads with, a GraphQL POST of queries
    only. Anything else is a write, or something zhpipe does not know to be a read."""
    path = "/" + path.lstrip("/")
    if method in ("GET", "HEAD"):
        return not _API.match(path) or bool((gets or _read_gets()).fullmatch(path))
    if method != "POST":
        return False
    if path.rstrip("/") == "/graphql":
        return _only_queries(body)
    return bool(_READ_POST.fullmatch(path))


class OwnerOnly:
    """ASGI middleware: the owner's credentials on every request, and reads only."""

    def __init__(self, inner):
        self.inner = inner
        self.expected = _credentials()
        self.gets = None

    async def __call__(self, scope, receive, send):
        # the UI uses none: refused before MLflow sees it, credentials or not
        if scope["type"] == "websocket":
            return await _refuse_websocket(scope, send)
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        ok = False
        if self.expected is not None and given[:6].lower() == b"basic ":
            try:
                ok = hmac.compare_digest(
                    base64.b64decode(given[6:].strip(), validate=True), self.expected
                )
            except ValueError:
                ok = False
        if not ok:
            return await _answer(
                send,
                401,
                "zhpipe ui: log in with the project's credentials (`zhpipe server "
                "status` prints them)",
                [(b"www-authenticate", b'Basic realm="zhpipe", charset="UTF-8"')],
            )
        if self.gets is None:
            self.gets = _read_gets()
        method, path = scope["method"], scope["path"]
        # the UI asks every page; zhpipe ui has no AI gateway
        if method == "GET" and _GATEWAY.fullmatch(path):
            return await _json(send, {"endpoints": []})
        if method != "POST" and (
            headers.get(b"content-length", b"0") not in (b"", b"0")
            # a body no read of the allow-list sends
            or b"transfer-encoding" in headers
        ):
            return await _answer(
                send,
                403,
                f"zhpipe ui is read-only: a {method} with a body is not one of the reads it allows",
            )
        # decided by its body, read below
        graphql = method == "POST" and path.rstrip("/") == "/graphql"
        # refused before a byte of its body is read
        if not graphql and not is_read(method, path, gets=self.gets):
            return await _answer(
                send,
                403,
                f"zhpipe ui is read-only: {method} {path} is not one of the reads it allows",
            )
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = MAX_BODY + 1
        if length > MAX_BODY:  # refused unread
            return await _answer(
                send, 413, f"zhpipe ui: a body of {length} bytes is over its limit of {MAX_BODY}"
            )
        chunks, size, more = [], 0, method == "POST"
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_BODY:
                return await _answer(
                    send, 413, f"zhpipe ui: a body over its limit of {MAX_BODY} bytes"
                )
        body = b"".join(chunks)
        if not is_read(method, path, body, self.gets):
            return await _answer(
                send,
                403,
                f"zhpipe ui is read-only: {method} {path} is not one of the reads it allows",
            )
        if method != "POST":
            return await self.inner(scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.inner(scope, replay, send)


async def _refuse_websocket(scope, send) -> None:
    """An HTTP 403 for a websocket handshake where the server can send one (ASGI's
    websocket.http.response), else a close before it is accepted (which servers answer with 403
    too)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        return await send({"type": "websocket.close", "code": 1008})
    data = b'{"error_code": "PERMISSION_DENIED", "message": "zhpipe ui serves no websockets"}'
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": data})


async def _json(send, obj) -> None:
    data = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _answer(send, status: int, text: str, headers: list | None = None) -> None:
    data = json.dumps(
        {
            "error_code": {403: "PERMISSION_DENIED", 413: "REQUEST_LIMIT_EXCEEDED"}.get(
                status, "UNAUTHENTICATED"
            ),
            "message": text,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


app = OwnerOnly(Starlette(routes=[Route("/zhpipe/open", open_page), Mount("/", app=mlflow_app)]))
