"""The house keeps its shape: no file in flows/ or tasks/ over 320 statements, no function over 55,
no line over 100 characters, and flows/ names stages through their declarations (at most 5 string
literals equal to a stage name, none a stage's own). Sizes are counted in logical lines (statements:
what ends in a NEWLINE token), which a formatter does not change, not in physical lines, which it
does."""

import ast
import io
import tokenize
from pathlib import Path

from tasks.stages import STAGE_NAMES

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_STATEMENTS, MAX_FUNCTION_STATEMENTS, MAX_STAGE_LITERALS, MAX_LINE = 320, 55, 5, 100


def _sources():
    return [p for pkg in ("flows", "tasks") for p in sorted((ROOT / pkg).rglob("*.py"))]


def _logical_rows(source: str) -> list[int]:
    """The rows on which a logical line ends (a statement, however many rows it spans)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.NEWLINE]


def test_no_file_is_over_320_statements_and_no_function_over_55():
    long_files, long_functions = [], []
    for p in _sources():
        source = p.read_text(encoding="utf-8")
        rows = _logical_rows(source)
        if len(rows) > MAX_FILE_STATEMENTS:
            long_files.append(f"{p.relative_to(ROOT)}: {len(rows)}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = sum(node.lineno <= r <= node.end_lineno for r in rows)
                if n > MAX_FUNCTION_STATEMENTS:
                    long_functions.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert long_files == [] and long_functions == []


def test_no_line_is_over_100_characters():
    """Characters, not bytes: a line of Chinese counts its characters. The tests keep the same
    width."""
    long_lines = [
        f"{p.relative_to(ROOT)}:{i}: {len(line)}"
        for p in [*_sources(), *sorted((ROOT / "tests").rglob("*.py"))]
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE
    ]
    assert long_lines == []


def stage_literals(folder: Path) -> list[str]:
    """Every string literal in `folder`'s modules that equals a stage name (docstrings and f-string
    parts are not literals)."""
    return [
        f"{p.relative_to(folder.parent)}:{node.lineno} {node.value!r}"
        for p in sorted(folder.rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in STAGE_NAMES
    ]


def test_flows_names_stages_through_their_declarations(tmp_path):
    found = stage_literals(ROOT / "flows")
    assert len(found) <= MAX_STAGE_LITERALS, found
    planted = tmp_path / "flows"
    planted.mkdir()
    (planted / "x.py").write_text('results.get("train")\nspec = kind.training\n')
    # the check sees a stage named by its string
    assert stage_literals(planted) == ["flows/x.py:1 'train'"]


def test_every_file_a_comment_or_page_names_exists():
    """A docstring, comment or page that names a file of the project names one that exists (results
    that benchmarks write are made by running them)."""
    import re

    named = re.compile(r"(?<![\w./-])((?:flows|tasks|tests|docs|benchmarks)/[\w/.-]*\w)")
    texts = [
        *_sources(),
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
        ROOT / "pipelines.yaml",
    ]
    missing = [
        f"{p.relative_to(ROOT)}:{i} {ref}"
        for p in texts
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        for ref in named.findall(line)
        if not ref.startswith("benchmarks/results")
        and "{" not in ref
        and not (ROOT / ref).exists()
        and not (ROOT / f"{ref}.py").exists()
    ]
    assert missing == []


def test_the_run_loop_is_short():
    """RunContext is the short loop around the stage cache (flows/plan/cache.py decides reuse): at
    most 100 statements."""
    source = (ROOT / "flows" / "orchestrate" / "execute.py").read_text(encoding="utf-8")
    run = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "RunContext"
    )
    assert sum(run.lineno <= r <= run.end_lineno for r in _logical_rows(source)) <= 100


def takes_the_run_first(folder: Path) -> list[str]:
    """The functions and methods in `folder` whose first argument (after `self`) is `run`."""
    found = []
    for p in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                if names[:1] == ["run"]:
                    found.append(f"{p.relative_to(folder.parent)}:{node.lineno} {node.name}")
    return found


def test_the_engine_is_one_loop_and_the_cache_has_one_caller(tmp_path):
    """The run engine's walk is in one place (flows/orchestrate/engine.py): few functions are handed
    the whole run (at most 6), and in the orchestration only RunContext (execute.py) calls the stage
    cache."""
    assert len(takes_the_run_first(ROOT / "flows")) <= 6, takes_the_run_first(ROOT / "flows")
    callers = sorted(
        p.name
        for p in (ROOT / "flows" / "orchestrate").glob("*.py")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "cache"
        and isinstance(node.value, ast.Attribute | ast.Name)
        and getattr(node.value, "attr", getattr(node.value, "id", "")) in ("run", "self")
    )
    assert set(callers) == {"execute.py"}, callers
    planted = tmp_path / "flows"
    planted.mkdir()
    (planted / "x.py").write_text("def a(run, b):\n    pass\n\n\ndef b(self, run):\n    pass\n")
    assert takes_the_run_first(planted) == ["flows/x.py:1 a", "flows/x.py:5 b"]


def test_every_zhpipe_process_a_test_starts_goes_through_the_one_helper():
    """`python -m flows.cli` is spelt once, in tests/helpers/procs.py (`zhpipe_argv`, used by
    `zhpipe` and `start`): a test that starts a command with Popen options of its own still takes
    its command line from there."""
    import re

    spelt = re.compile(r"""["']-m["']\s*,\s*["']flows\.cli["']""")
    helper = ROOT / "tests" / "helpers" / "procs.py"
    elsewhere = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p != helper
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if spelt.search(line)
    ]
    assert elsewhere == [] and spelt.search(helper.read_text(encoding="utf-8"))
