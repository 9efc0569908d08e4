"""The command line's parser reads the kinds' declarations only when it needs them: a `zhpipe run`
or `zhpipe status` handed to the warm process parses in its own process without importing any stage
module (pandas and more)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# in a new interpreter: what each parse loaded, and what it answered
_PROBE = """
import contextlib, io, json, sys
from flows.cli import _parser

def loaded():
    return {"stages": "tasks.stages" in sys.modules, "pandas": "pandas" in sys.modules}

out = {}
parser = _parser()
COMMANDS = [("status", ["status", "smoke"]),
            ("run", ["run", "smoke", "--set", "train.epochs=1", "--verify"])]
for name, argv in COMMANDS:
    args = parser.parse_args(argv)
    out[name] = {**loaded(), "command": args.command}
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        parser.parse_args(["run", "--to", "bogus"])
    except SystemExit as e:
        out["bogus"] = {"code": e.code, "said": err.getvalue().strip().splitlines()[-1]}
args = parser.parse_args(["run", "--from", "segment", "--force"])
out["named"] = {"start": args.start, "force": args.force}
help_text = io.StringIO()
with contextlib.redirect_stdout(help_text):
    try:
        parser.parse_args(["init", "--help"])
    except SystemExit:
        pass
out["init_help"] = help_text.getvalue()
print(json.dumps(out))
"""


def test_run_and_status_parse_without_the_stage_modules_and_stage_names_still_checked():
    from tasks.stages import KINDS, STAGE_NAMES

    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("status", "run"):
        assert out[name] == {"stages": False, "pandas": False, "command": name}, out[name]
    assert out["bogus"]["code"] == 2
    assert "invalid choice: 'bogus'" in out["bogus"]["said"] and all(
        s in out["bogus"]["said"] for s in STAGE_NAMES
    )
    assert out["named"] == {"start": "segment", "force": ""}
    starters = [s for kind in KINDS.values() for s in kind.starters]
    assert {"csv", "nightly", "ner", "pairs"} <= {s.option for s in starters}
    assert starters and all(f"--{s.option}" in out["init_help"] for s in starters), out["init_help"]
    assert all(flag in out["init_help"] for s in starters for flag, _, _ in s.options)
