"""The MLflow UI as `zhpipe ui` serves it (`mlflow server --app-name zhpipe`): MLflow's own server app, plus one
page, `/zhpipe/open?to=#/...`, that sets the UI's view to machine learning (runs, metrics, models) in the browser and
then opens the page asked for. MLflow 3 keeps its GenAI/machine-learning toggle in the browser's localStorage
(`mlflow.workflowType_v1`) and starts in GenAI; only a page of the same origin can set it, and from then on every
page of the UI opens in the runs view, links without `?workflowType=` included (and, on a first visit, without the
assistant panel MLflow opens by itself)."""
from __future__ import annotations

import json
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
  for (const [k, v] of Object.entries({first})) if (localStorage.getItem(k) === null) localStorage.setItem(k, JSON.stringify(v));
}} catch (e) {{}}
location.replace("/" + {target});
</script>
<noscript><a href="/{target_plain}">MLflow</a></noscript>"""


def open_page(request: Request) -> HTMLResponse:
    target = request.query_params.get("to", "")
    if not _TARGET.fullmatch(target):
        target = "#/experiments"
    return HTMLResponse(PAGE.format(key=json.dumps(VIEW_KEY), value=json.dumps(json.dumps(VIEW)), first=json.dumps(FIRST_VISIT),
                                    target=json.dumps(target), target_plain=target))


app = Starlette(routes=[Route("/zhpipe/open", open_page), Mount("/", app=mlflow_app)])
