"""Pictures of both UIs as a user first sees them, made with headless Chromium (`apt-get install
chromium`): the Prefect flow-run page of a pipeline run (from `zhpipe server start`) and the page
`zhpipe ui` prints.

    python docs/screenshots.py [--pipeline smoke] [--out docs/images] [--force STAGE]

It starts the project's background Prefect server (left running; `zhpipe server stop` ends it), runs
the pipeline through it, finds its flow run through the server's HTTP API by the pipeline's tag,
starts the MLflow UI on the project's port, waits until each page answers, and writes
`prefect-flow-run.png` and `mlflow-runs.png`.

`zhpipe ui` asks for the project's credentials (a browser shows its login prompt). A script logs in
with a header, never with credentials in the URL (MLflow's page refuses to load from such a URL):
`header_proxy` below is a loopback proxy that adds `Authorization: Basic ...` to every request of
its owner's (another local user's connection is refused: `flows.plan.private.peer_uid`), and
Chromium is pointed at the proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZHPIPE = [sys.executable, "-m", "flows.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shoot(url: str, path: Path, budget_ms: int = 20000) -> None:
    browser = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if not browser:
        raise SystemExit("no Chromium found: apt-get install chromium")
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1500,950",
            f"--virtual-time-budget={budget_ms}",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=180,
    )
    print(f"{path} <- {url}")


def header_proxy(target: str, user: str, password: str) -> tuple[object, str]:
    """(the server, its address): a proxy on a free loopback port that forwards each GET and POST to
    `target` with the login as an Authorization header. Stop it with `server.shutdown()`."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from flows.plan.private import peer_uid

    header = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Forward(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            self.forward(None)

        # the UI searches runs with POSTs (reads: zhpipe ui allows no writes)
        def do_POST(self):  # noqa: N802
            self.forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def forward(self, body):
            # the proxy logs in as its owner: it answers its owner's connections only, the peer
            # proved by the full addresses of an established socket (another local user's are
            # refused)
            if peer_uid(self.client_address[:2], self.server.server_address[:2]) != os.getuid():
                self.send_error(403, "this proxy answers its owner only")
                return
            headers = {
                "Authorization": header,
                "Content-Type": self.headers.get("Content-Type", "application/json"),
                # Prefect's server answers a page's path with its UI only when HTML is accepted
                "Accept": self.headers.get("Accept", "*/*"),
            }
            request = urllib.request.Request(target + self.path, data=body, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - loopback
                    status, headers, body = answer.status, answer.headers.items(), answer.read()
            except urllib.error.HTTPError as e:
                status, headers, body = e.code, e.headers.items(), e.read()
            if self.path.startswith("/ui-settings"):  # Prefect's UI: its API through here too
                host, port = self.server.server_address[:2]
                body = body.replace(target.encode(), f"http://{host}:{port}".encode())
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def flow_run_id(api: str, pipeline: str, login: str) -> str:
    """The newest flow run tagged with the pipeline, through Prefect's REST API (`login`: the
    server's `user:password`)."""
    import base64

    body = json.dumps(
        {
            "flow_runs": {"tags": {"all_": [f"pipeline:{pipeline}"]}},
            "sort": "START_TIME_DESC",
            "limit": 1,
        }
    ).encode()
    auth = "Basic " + base64.b64encode(login.encode()).decode()
    req = urllib.request.Request(
        f"{api}/flow_runs/filter",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": auth},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        runs = json.loads(resp.read())
    if not runs:
        raise SystemExit(f"no flow run tagged pipeline:{pipeline} on {api}")
    return runs[0]["id"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pipeline", default="smoke")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    ap.add_argument(
        "--force",
        metavar="STAGE",
        help="rebuild from this stage on (a cached run has no task runs)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    started = subprocess.run(
        [*ZHPIPE, "server", "start"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    print(started.strip())
    api = started.split(" running at ")[1].split()[0]
    # the server asks for the project's login (printed by `server start`, kept in its Prefect home)
    login = started.split("credentials (the UI on first load): ")[1].split()[0]
    force = ["--force", args.force] if args.force else []
    subprocess.run([*ZHPIPE, "run", args.pipeline, *force], cwd=ROOT, env=env, check=True)
    run = flow_run_id(api, args.pipeline, login)
    ui = api.removesuffix("/api")
    proxy, address = header_proxy(ui, *login.split(":", 1))
    try:
        shoot(f"{address}/runs/flow-run/{run}", args.out / "prefect-flow-run.png")
    finally:
        proxy.shutdown()
    mlflow_ui = subprocess.Popen(
        [*ZHPIPE, "ui"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        printed = ""
        while not printed.startswith("MLflow UI on"):  # printed once the UI answers, with the login
            printed = mlflow_ui.stdout.readline()
            if not printed and mlflow_ui.poll() is not None:
                raise SystemExit("zhpipe ui exited before it answered")
        url = printed.split(" on ")[1].split()[0]
        user, password = printed.split("(log in as ")[1].split(";")[0].split(", password ")
        base = url.split("/zhpipe/")[0]
        proxy, address = header_proxy(base, user, password)
        try:
            shoot(address + url.removeprefix(base), args.out / "mlflow-runs.png")
        finally:
            proxy.shutdown()
    finally:
        mlflow_ui.terminate()
        mlflow_ui.wait(timeout=30)


if __name__ == "__main__":
    main()
