"""A team's own code in a pipeline: `module:function` references in pipelines.yaml (a cleaning rule,
a data check, an estimator), found in the project folder first, then among installed packages.

Three promises, the same for every kind of reference:

- Trust: the module's file, and each project module it imports, must be writable by its owner only,
  and that owner must be you or root, in folders no one else can write
  (`tasks.util.private.not_trusted`). Anything else is refused in one line naming the file, before a
  line of it runs: loading code runs it as you.
- Keys: a reference's code counts in the key of the stage that runs it, as zhpipe's own code does:
  each module as a hash of its syntax tree without docstrings (a comment or a reformatting changes
  nothing; any change to what runs does), with every project module it imports.
- One line for every mistake: a malformed reference, a missing module or function (with a
  did-you-mean), a function that raises (its name and the error's last line).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tasks.errors import ConfigError

_REF = re.compile(r"(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<function>[A-Za-z_]\w*)")


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` without the docstrings of its module, classes and functions (they do not run)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def tree_digest(text: bytes) -> tuple[str, set[str]]:
    """(a hash of the source's syntax tree without docstrings, the absolute module names it
    imports): what a key sees of one module."""
    tree = ast.parse(text.decode("utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module)
            imported |= {f"{node.module}.{a.name}" for a in node.names}
    digest = hashlib.sha256(
        ast.dump(strip_docstrings(tree), annotate_fields=False).encode()
    ).hexdigest()[:16]
    return digest, imported


@dataclass(frozen=True)
class CodeRef:
    """`module:function`, as pipelines.yaml names a team's function
    (`my_rules:drop_symbol_only`)."""

    module: str
    function: str

    @classmethod
    def parse(cls, text: str, where: str) -> CodeRef:
        found = _REF.fullmatch(str(text).strip())
        if not found:
            raise ConfigError(
                f"{where}: {text!r} is not a reference to a function (expected module:function, "
                "e.g. "
                f"my_rules:drop_symbol_only)"
            )
        return cls(found["module"], found["function"])

    def __str__(self) -> str:
        return f"{self.module}:{self.function}"

    @property
    def name(self) -> str:
        """The function's name, as run tables and metrics show it."""
        return self.function


def _in_project(module: str, project: Path) -> Path | None:
    base = project.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_file(module: str, project: Path, where: str = "") -> Path:
    """The file of `module`: the project folder's first (`my_rules.py` beside pipelines.yaml), else
    an installed package's (found without running the module itself); one line with a did-you-mean
    when there is none."""
    found = _in_project(module, project)
    if found is not None:
        return found
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    nearby = sorted(
        {p.stem for p in project.glob("*.py")}
        | {p.parent.name for p in project.glob("*/__init__.py")}
    )
    close = difflib.get_close_matches(module.split(".")[-1], nearby, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(
        f"{where}: no module {module} (looked in {project} and the installed packages){hint}"
    )


def _refuse_untrusted(file: Path, where: str) -> None:
    from tasks.util.private import not_trusted

    why = not_trusted(file)
    if why is not None:
        raise ConfigError(
            f"{where}: {why}; zhpipe runs only code no one else could have written (chmod go-w, or "
            f"move it into a folder of yours)"
        )


def code_files(ref: CodeRef, project: Path, where: str) -> dict[str, tuple[Path, str]]:
    """Every file of code `ref` runs that is the team's (its module, and each module of the project
    folder or of the module's own package that it imports, transitively), trust-checked, by the name
    a key and `status` show: the path in the project folder, else `<package>/<path>.py`. Values:
    (file, syntax-tree digest)."""
    first = module_file(ref.module, project, where)
    package_root = project if first.is_relative_to(project) else _package_root(first, ref.module)
    found: dict[str, tuple[Path, str]] = {}
    todo = [(ref.module, first)]
    while todo:
        module, file = todo.pop()
        shown = (
            file.relative_to(package_root).as_posix()
            if file.is_relative_to(package_root)
            else str(file)
        )
        if shown in found:
            continue
        _refuse_untrusted(file, where)
        digest, imported = tree_digest(file.read_bytes())
        found[shown] = (file, digest)
        for name in sorted(imported):
            nested = _in_project(name, package_root)
            if nested is not None:
                todo.append((name, nested))
    return dict(sorted(found.items()))


def _package_root(file: Path, module: str) -> Path:
    """The folder an installed module's dotted name starts in (site-packages, for
    `acme_nlp.models`)."""
    root = file.parent if file.name != "__init__.py" else file.parent.parent
    for _ in module.split(".")[1:]:
        root = root.parent
    return root


def fingerprint(refs: list[CodeRef], project: Path, where: str) -> dict[str, str]:
    """What a key sees of `refs`: each file of their code (`code_files`) by its shown name, and its
    digest."""
    return {
        name: digest
        for ref in refs
        for name, (_, digest) in code_files(ref, project, where).items()
    }


@contextlib.contextmanager
def _project_first(project: Path):
    """`project` first on sys.path while a module is imported (a project module wins over an
    installed one)."""
    entry = str(project)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


# module -> (its file, its source's sha256) when this process imported it
_IMPORTED: dict[str, tuple[str, str]] = {}


def load(ref: CodeRef, project: Path, where: str) -> Callable:
    """The function `ref` names, its code trust-checked first (every file of it, before any runs);
    one line for a module that fails to import or a missing function (with a did-you-mean)."""
    files = code_files(ref, project, where)
    first = module_file(ref.module, project, where)
    source = hashlib.sha256(first.read_bytes()).hexdigest()
    loaded = sys.modules.get(ref.module)
    if loaded is not None and (_IMPORTED.get(ref.module) != (str(first), source)):
        # imported before from another file or another version of it (another project, an edit
        # since): imported again, with the project modules it imports, so that what runs is what the
        # key holds
        for name in [ref.module, *(n.removesuffix(".py").replace("/", ".") for n in files)]:
            sys.modules.pop(name.removesuffix(".__init__"), None)
    with _project_first(project):
        try:
            module = importlib.import_module(ref.module)
            _IMPORTED[ref.module] = (str(first), source)
        except ConfigError:
            raise
        # the team's module may raise anything while it imports
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"{where}: importing {ref.module} failed: {last_line(e)}") from None
    function = getattr(module, ref.function, None)
    if not callable(function):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(ref.function, names, n=1)
        hint = f"; did you mean {ref.module}:{close[0]}?" if close else ""
        raise ConfigError(f"{where}: {ref.module} has no function {ref.function}{hint}")
    return function


def last_line(error: BaseException) -> str:
    """An exception as one line: its type and the last line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1][:300]}" if lines else type(error).__name__
