"""The Python API page's example (docs/api.md, which the README points to) runs as written (on the
smoke pipeline, in this repository's project)."""

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"
pytestmark = pytest.mark.e2e


def python_example() -> str:
    section = PAGE.read_text(encoding="utf-8").split("# Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_example_runs(smoke, capsys):
    code = python_example()
    assert "api.run(" in code and "api.load_model(" in code
    exec(compile(code, str(PAGE), "exec"), {})
    printed = capsys.readouterr().out
    assert "'evaluate': 'miss'" in printed or "'evaluate': 'hit'" in printed
    assert "started" in printed  # the runs table's header
