"""The layers run one way: flows/ imports tasks/, tasks/ imports neither flows/ nor prefect nor
mlflow, and no two modules import each other (directly or round a longer circle). Read from the
source with `ast`, so a lazy import inside a function counts as much as one at the top."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flows", "tasks")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module an import statement in the file names (absolute imports; `from x import y` gives
    x and x.y)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _graph(root: Path) -> dict[str, set[str]]:
    files = {_module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    return {
        name: {m for m in _imports(path) if m in files and m != name}
        for name, path in files.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_tasks_import_neither_flows_nor_prefect_nor_mlflow():
    offenders = [
        (str(p.relative_to(ROOT)), m)
        for p in (ROOT / "tasks").rglob("*.py")
        for m in _imports(p)
        if m.split(".")[0] in ("flows", "prefect", "mlflow")
    ]
    assert offenders == []


def test_no_import_cycles():
    assert _cycle(_graph(ROOT)) is None


def test_the_check_finds_a_planted_cycle(tmp_path):
    """The cycle check is not vacuous: two modules that import each other, one lazily, are
    reported."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "tasks" / "a.py").write_text("from tasks import b\n")
    (tmp_path / "tasks" / "b.py").write_text("def f():\n    from tasks.a import x\n")
    (tmp_path / "flows" / "c.py").write_text("import tasks.a\n")
    assert _cycle(_graph(tmp_path)) == ["tasks.a", "tasks.b", "tasks.a"]


# the planning room: what plans keys and keeps the store, usable without Prefect or MLflow (`zhpipe
# status` of a pipeline, gc, verify read only these, and what they import)
PLANNING = (
    "flows.plan.config",
    "flows.plan.project",
    "flows.plan.keys",
    "flows.plan.sources",
    "flows.plan.fingerprint",
    "flows.plan.store",
    "flows.plan.status",
    "flows.plan.maintenance",
    "flows.plan.init",
)


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    return seen


def test_the_planning_room_imports_neither_prefect_nor_mlflow():
    """Transitively over flows/ and tasks/: a module of the planning room, and every module it
    imports, names no Prefect or MLflow module (a key needs a registered model's version: the lookup
    is passed in)."""
    graph = _graph(ROOT)
    files = {_module_name(p, ROOT): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    offenders = sorted(
        {
            (name, m)
            for room in PLANNING
            for name in _reached(graph, room)
            for m in _imports(files[name])
            if m.split(".")[0] in ("prefect", "mlflow")
        }
    )
    assert offenders == []


def _kind_words() -> set[str]:
    """What only a task kind knows: its name, its test split's scored columns, its metrics, its
    answer columns and its model flavour (read from the kinds' declarations, so a new kind's words
    count too). `label` is the graph's own word (`TaskKind.labelled`: a kind's splits carry a label
    column), not one kind's."""
    from tasks.stages import KINDS, serving

    words = set()
    for kind in KINDS.values():
        shown = serving(kind).SHOWN
        words |= {
            kind.name,
            kind.flavour,
            *kind.scored,
            *(m.removeprefix("test_") for m in kind.reported),
            shown.answer,
            *shown.columns,
        }
    return words - {"label"}


def _named_kinds(root: Path, words: set[str]) -> list[str]:
    """`file:line: 'word'` for each string literal under root/flows that is one of `words`."""
    found = []
    for path in sorted((root / "flows").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in words
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_flows_names_no_task_kind_nor_its_columns_or_metrics():
    """flows/ runs every kind alike: what a kind knows (tasks/<kind>/: its serving, scoring, init
    template, metric columns) is asked of the kind's declaration, never written in flows/ as a
    literal."""
    words = _kind_words()
    assert {"ner", "translation", "classification", "bleu", "tags", "entities"} <= words
    assert _named_kinds(ROOT, words) == []


def test_the_kind_check_finds_a_planted_literal(tmp_path):
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "x.py").write_text(
        '"""A doc about ner."""\nif kind == "ner":\n    metric = "bleu"\n'
    )
    assert _named_kinds(tmp_path, _kind_words()) == ["flows/x.py:2: 'ner'", "flows/x.py:3: 'bleu'"]


RUNTIME, ENTRY = "flows.runtime", "flows.cli"  # the daemon's room, and the CLI
# the modules outside the runtime that may import it: zhpipe's entry point and the warm process's
# program
ENTRIES = (ENTRY, "flows.cli.warm")


def _in(room: str, name: str) -> bool:
    """Whether module `name` is `room` or inside it."""
    return name == room or name.startswith(f"{room}.")


def _arrows(root: Path, arrow) -> list[str]:
    """`a -> b` for each import of `b` by `a` in the tree at `root` for which `arrow(a, b)` holds,
    sorted."""
    return sorted(
        f"{name} -> {m}" for name, deps in _graph(root).items() for m in deps if arrow(name, m)
    )


def _into_runtime(root: Path) -> list[str]:
    """The modules outside the runtime room, other than the entry points, that import anything of
    it."""
    return _arrows(root, lambda a, b: not _in(RUNTIME, a) and a not in ENTRIES and _in(RUNTIME, b))


def test_only_the_entry_point_imports_the_runtime():
    """The runtime (background server, warm process, hand-over, process records) is a room of its
    own: commands declare what they need (`Needs`) and the entry point provides it; no other module
    of flows/ reaches into the room."""
    graph = _graph(ROOT)
    assert "flows.runtime.warm" in graph and any(m.startswith(RUNTIME) for m in graph[ENTRY])
    assert _into_runtime(ROOT) == []


def test_the_runtime_check_finds_a_planted_import(tmp_path):
    for folder in ("flows/runtime", "flows/cli", "flows/track", "tasks"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "flows" / "runtime" / "__init__.py").write_text("")
    (tmp_path / "flows" / "runtime" / "server.py").write_text("from flows.track import x\n")
    (tmp_path / "flows" / "cli" / "__init__.py").write_text("from flows.runtime import server\n")
    (tmp_path / "flows" / "track" / "x.py").write_text(
        "def f():\n    from flows.runtime.server import start\n"
    )
    assert _into_runtime(tmp_path) == ["flows.track.x -> flows.runtime.server"]


def _models_into_kinds(root: Path, kinds: tuple[str, ...]) -> list[str]:
    """Imports from the shared model parts (tasks/models) up into a kind's folder (tasks/<kind>) or
    into the plan of the house that gathers the kinds (tasks/stages.py)."""
    return _arrows(
        root,
        lambda a, b: (
            _in("tasks.models", a)
            and (b == "tasks.stages" or any(_in(f"tasks.{k}", b) for k in kinds))
        ),
    )


def test_shared_model_parts_import_no_kind():
    """A kind's models live in its folder and import the shared parts (encoders, the trainer); the
    shared parts never import a kind nor the registry of every kind's models (tasks.stages.MODELS,
    gathered from the kinds' `models`)."""
    from tasks.stages import KINDS, MODELS

    assert set(MODELS) == {name for k in KINDS.values() for name in k.models} and all(
        k.models for k in KINDS.values()
    )
    assert _models_into_kinds(ROOT, tuple(KINDS)) == []


def test_the_model_check_finds_a_planted_import(tmp_path):
    for folder in ("tasks/models", "tasks/ner", "flows"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tasks" / "ner" / "tagging.py").write_text("")
    (tmp_path / "tasks" / "stages.py").write_text("")
    (tmp_path / "tasks" / "models" / "crf.py").write_text(
        "def f():\n    from tasks.ner.tagging import tag_set\n"
    )
    (tmp_path / "tasks" / "models" / "__init__.py").write_text(
        "def registry():\n    from tasks.stages import KINDS\n"
    )
    assert _models_into_kinds(tmp_path, ("ner",)) == [
        "tasks.models -> tasks.stages",
        "tasks.models.crf -> tasks.ner.tagging",
    ]


# flows/' rooms from the bottom up: a module imports its own room and those below it, never one
# above
ROOMS = (
    ("flows.needs", "flows.plan"),
    ("flows.pools",),
    ("flows.track",),
    ("flows.orchestrate",),
    ("flows.cli", "flows.api"),
)


def _upward(root: Path) -> list[str]:
    """`a -> b` for each import of a module in a room above the importer's (the runtime, beside
    them, is checked by the entry-point test; what it imports of the CLI is listed by
    `_runtime_into_cli`)."""

    def level(name: str) -> int | None:
        return next((i for i, room in enumerate(ROOMS) for top in room if _in(top, name)), None)

    return _arrows(root, lambda a, b: None not in (level(a), level(b)) and level(b) > level(a))


def _runtime_into_cli(root: Path) -> list[str]:
    return _arrows(root, lambda a, b: a.startswith(f"{RUNTIME}.") and _in(ENTRY, b))


def test_the_rooms_import_downwards_only():
    """track never imports orchestrate (the chunk pools and the cross-machine locks it shares with
    orchestrate live in flows/pools below both), the commands' declared needs live below the CLI and
    the runtime (flows/needs.py), and the runtime imports nothing of the CLI (the warm process's
    program is the CLI's, flows/cli/warm.py, which hands the runtime the command its forks run)."""
    assert _upward(ROOT) == []
    assert _runtime_into_cli(ROOT) == []


def test_the_room_check_finds_a_planted_upward_import(tmp_path):
    for folder in ("flows/track", "flows/orchestrate", "flows/plan", "tasks"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "flows" / "orchestrate" / "chunks.py").write_text("from flows.track import x\n")
    (tmp_path / "flows" / "track" / "x.py").write_text(
        "def f():\n    from flows.orchestrate.chunks import pool\n"
    )
    (tmp_path / "flows" / "plan" / "keys.py").write_text("import flows.track.x\n")
    assert _upward(tmp_path) == [
        "flows.plan.keys -> flows.track.x",
        "flows.track.x -> flows.orchestrate.chunks",
    ]


def _kind_into_kind(root: Path, kinds: tuple[str, ...]) -> list[str]:
    """Imports from one kind's folder (tasks/<kind>) into another's."""

    def kind_of(name: str) -> str | None:
        return next((k for k in kinds if _in(f"tasks.{k}", name)), None)

    return _arrows(
        root, lambda a, b: kind_of(a) is not None and kind_of(b) not in (None, kind_of(a))
    )


def test_no_kind_imports_another_kind():
    """Each kind is a closed folder: what two kinds share lives in tasks/shared, tasks/models,
    tasks/util or at the root of tasks/ (translation's serving took classification's segmenter and
    clean settings before)."""
    from tasks.stages import KINDS

    # every kind's models its own: each spec's training code in the kind's folder
    assert all(
        _in(f"tasks.{name}", spec.train.__module__)
        for name, k in KINDS.items()
        for spec in k.models.values()
    )
    assert _kind_into_kind(ROOT, tuple(KINDS)) == []


def test_the_kind_check_finds_a_planted_import_between_kinds(tmp_path):
    for folder in ("tasks/ner", "tasks/translation", "flows"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tasks" / "ner" / "serving.py").write_text("")
    (tmp_path / "tasks" / "translation" / "serving.py").write_text(
        "from tasks.ner.serving import x\n"
    )
    assert _kind_into_kind(tmp_path, ("ner", "translation")) == [
        "tasks.translation.serving -> tasks.ner.serving"
    ]


def test_the_arrows_that_ran_back_up_are_gone():
    """The five imports that ran against the layers (v6): the commands' needs from the CLI, the warm
    process running the CLI, the predictions' and the champion's pools and slots from orchestrate,
    the shared model parts reading the plan of the house. The room checks above cover them in
    general; these name them."""
    graph = _graph(ROOT)
    named = [
        ("flows.runtime.commands", "flows.cli"),
        ("flows.runtime.warm", "flows.cli"),
        ("flows.track.predict", "flows.orchestrate"),
        ("flows.track.champion", "flows.orchestrate"),
        ("tasks.models", "tasks.stages"),
    ]
    assert all(a in graph for a, _ in named[1:])
    assert [
        f"{a} -> {b}" for a, room in named for b in sorted(graph.get(a, ())) if _in(room, b)
    ] == []
