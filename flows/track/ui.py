"""The MLflow UI as `zhpipe ui` serves it (`mlflow server --app-name zhpipe`): MLflow's own server app, plus one
page, `/zhpipe/open?to=#/...`, that sets the UI's view to machine learning (runs, metrics, models) in the browser and
then opens the page asked for. MLflow 3 keeps its GenAI/machine-learning toggle in the browser's localStorage
(`mlflow.workflowType_v1`) and starts in GenAI; only a page of the same origin can set it, and from then on every
page of the UI opens in the runs view, links without `?workflowType=` included (and, on a first visit, without the
assistant panel MLflow opens by itself).

Only its owner reaches it: every request must carry the project's credentials (HTTP basic auth, the same
`user:password` the project's Prefect server asks for, kept 0600 in the Prefect home; the file's path comes in
`ZHPIPE_UI_AUTH_FILE`), and it is read-only: a request that would write to the store (create, update, delete, log,
register, set an alias, upload an artifact) is refused with 403, whoever sends it. The UI itself only reads."""
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
# its assistant panel (an LLM chat) opens by itself on a first visit: closed, unless the user chose otherwise before
FIRST_VISIT = {"mlflow.assistant.panelOpen_v1": False, "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True}
_TARGET = re.compile(r"#/[A-Za-z0-9/_.?=&%-]*")  # a route of the UI; anything else opens the experiment list

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
    return HTMLResponse(PAGE.format(key=json.dumps(VIEW_KEY), value=json.dumps(json.dumps(VIEW)),
                                    first=json.dumps(FIRST_VISIT), target=json.dumps(target), target_plain=target))


# what the UI asks with POST while it only reads: searches, bulk gets, GraphQL queries
_READ_POST = re.compile(r".*/(([a-z]+-)*(search|get)(-[a-z]+)*|graphql)/?")
AUTH_FILE = "ZHPIPE_UI_AUTH_FILE"


def _credentials() -> bytes | None:
    """The `user:password` the server demands, read from the owner's private file; None when it cannot be read (then
    every request is refused: a server without credentials serves no one)."""
    path = os.environ.get(AUTH_FILE)
    try:
        auth = json.loads(open(path, encoding="utf-8").read()).get("auth_string") if path else None
    except (OSError, ValueError):
        return None
    return auth.encode() if isinstance(auth, str) and ":" in auth else None


def is_read(method: str, path: str, body: bytes = b"") -> bool:
    """Whether a request only reads the store: GET and HEAD, and the POSTs the UI reads with (a GraphQL request only
    when it holds no mutation)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return True
    if method != "POST" or not _READ_POST.fullmatch(path):
        return False
    return not path.rstrip("/").endswith("graphql") or b"mutation" not in body.lower()


class OwnerOnly:
    """ASGI middleware: the owner's credentials on every request, and reads only."""

    def __init__(self, inner):
        self.inner = inner
        self.expected = _credentials()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"")
        ok = False
        if self.expected is not None and given[:6].lower() == b"basic ":
            try:
                ok = hmac.compare_digest(base64.b64decode(given[6:].strip(), validate=True), self.expected)
            except ValueError:
                ok = False
        if not ok:
            return await _answer(send, 401, "zhpipe ui: log in with the project's credentials (`zhpipe server "
                                 "status` prints them)",
                                 [(b"www-authenticate", b'Basic realm="zhpipe", charset="UTF-8"')])
        body, more = b"", True
        if scope["method"] == "POST" and scope["path"].rstrip("/").endswith("graphql"):
            chunks = []
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
        if not is_read(scope["method"], scope["path"], body):
            return await _answer(send, 403, f"zhpipe ui is read-only: {scope['method']} {scope['path']} "
                                 f"would change the store")
        if body or not more:
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            return await self.inner(scope, replay, send)
        return await self.inner(scope, receive, send)


async def _answer(send, status: int, text: str, headers: list | None = None) -> None:
    data = json.dumps({"error_code": "PERMISSION_DENIED" if status == 403 else "UNAUTHENTICATED",
                       "message": text}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


app = OwnerOnly(Starlette(routes=[Route("/zhpipe/open", open_page), Mount("/", app=mlflow_app)]))
