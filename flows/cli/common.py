"""What the command groups share: the options every pipeline command takes, the config they load,
the console they print to."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from flows.plan import project
from tasks.errors import ZhpipeError


class Parser(argparse.ArgumentParser):
    """The command line's parsers (the top one and, through it, each command's). A command may add
    arguments `later`: when its parser parses or shows its help, not when the command line is built.
    What every kind declares (starter corpora, stage names) comes from the kinds' declarations,
    which import their stages' modules (pandas and more: about 0.5 s); a `zhpipe run` or `zhpipe
    status` handed to the warm process never needs them in its own process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._later: list = []

    def later(self, add) -> None:
        """`add(self)` just before this parser is first used."""
        self._later.append(add)

    def _ready(self) -> None:
        while self._later:
            self._later.pop(0)(self)

    def parse_known_args(self, args=None, namespace=None):
        self._ready()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._ready()
        return super().format_usage()

    def format_help(self) -> str:
        self._ready()
        return super().format_help()


class StageNames(Sequence):
    """Every kind's stage names as an option's `choices`, read from the kinds' declarations only
    when a stage is named or the choices are shown (see `Parser`)."""

    def __init__(self, *extra: str):
        self.extra = extra

    def _names(self) -> list[str]:
        from tasks.stages import STAGE_NAMES  # the stage graph, with its stages' modules

        return [*self.extra, *STAGE_NAMES]

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zhpipe")
    except PackageNotFoundError:
        return "unknown"


def source_of(args) -> dict | None:
    if not args.source:
        return None
    # columns not given are the pipeline's own (None: kept from its source)
    return {"path": args.source, "text_column": args.text_column, "label_column": args.label_column}


def config_file(args) -> Path:
    return getattr(args, "config", None) or project.current().config_file


def explicit_config(args) -> str | None:
    """A --config file other than the project's, as deployments and flows receive it (None for the
    default)."""
    return str(args.config.resolve()) if args.config else None


def request_of(args):
    """What the command line asks to build (flows/plan/request.py): made once, parsed once, handed
    to the flow whole."""
    from flows.plan.request import RunRequest

    overrides = list(args.overrides) + (
        ["source.allow_unverified=true"] if args.allow_unverified else []
    )
    return RunRequest.of(pipeline_name(args), overrides, source_of(args), explicit_config(args))


def load(args):
    """The validated config of the pipeline the command line names."""
    return request_of(args).config()


def pipeline_name(args) -> str:
    """The pipeline named on the command line, else the first one in the file."""
    from flows.plan.config import list_pipelines

    name = getattr(args, "pipeline", None)
    if name:
        return name
    names = list(list_pipelines(config_file(args)))
    if not names:
        raise ZhpipeError(f"{config_file(args)}: no pipelines declared")
    return names[0]


def configs(args, default_all: bool) -> list:
    from flows.plan.config import list_pipelines, load_pipeline

    file = config_file(args)
    configs = [load_pipeline(n, file) for n in (args.pipelines or list_pipelines(file))]
    if not args.pipelines and not default_all:
        configs = [c for c in configs if c.schedule is not None]
    if not configs:
        raise ZhpipeError(f"{file}: no pipeline has a `schedule`; name the pipelines to serve")
    return configs


def store_of(args):
    from flows.plan.config import list_pipelines, load_pipeline
    from flows.plan.store import StageStore, storage_root

    first = load_pipeline(next(iter(list_pipelines(project.current().config_file))))
    return StageStore(storage_root(first, args.storage))


def console():
    """A rich console; piped or logged (a cron job's file), one wide enough that no table cell is
    cut or wrapped."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=10_000)


def number(value: float) -> str:
    """A metric as people read it: whole numbers with thousands separators, scores (below 1) to 4
    decimals as every table shows them (0.8880, not 0.888), others to 4 significant digits."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4f}" if abs(value) < 1 else f"{value:.4g}"


def cell(value) -> str:
    """A table value as printed: floats to 4 decimals, nothing for None and NaN."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def print_frame(df, title: str, no_wrap: tuple[str, ...] = (), width: int | None = None) -> None:
    """`df` as a table; `width`: drawn in that many columns (the caller chose columns that fit),
    even into a pipe."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tasks.errors import printable

    table = Table(title=escape(printable(title)))
    for col in df.columns:
        table.add_column(
            escape(printable(col)),
            justify="right" if df[col].dtype.kind in "if" else "left",
            no_wrap=col in no_wrap,
            overflow="fold",
        )
    # values as text, never as markup: `train.models=[tfidf_lr]` keeps its list
    for row in df.itertuples(index=False):
        # a corpus's escape codes, shown, not obeyed
        table.add_row(*[escape(printable(cell(v))) for v in row])
    (console() if width is None else Console(width=width)).print(table)


def pipeline_args(p: argparse.ArgumentParser) -> None:
    """The options of a command on one pipeline: which, from which file, with which changes, on
    which corpus."""
    p.add_argument(
        "pipeline", nargs="?", help="pipeline name (default: the first in pipelines.yaml)"
    )
    p.add_argument(
        "--config", type=Path, help="pipelines file (default: the project's pipelines.yaml)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="STAGE.PARAM=VALUE",
        help="override one parameter for this run (repeatable)",
    )
    p.add_argument("--source", help="run on another corpus: a path or URL")
    p.add_argument(
        "--text-column",
        help="with --source: the text column (default: the pipeline's source.text_column)",
    )
    p.add_argument(
        "--label-column",
        help="with --source: the label column (default: the pipeline's source.label_column)",
    )
    p.add_argument(
        "--allow-unverified",
        action="store_true",
        help="fetch an http(s) source without a sha256, keyed by the "
        "server's ETag/Last-Modified/size (re-checked on every run)",
    )


def storage_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage",
        metavar="URL",
        help="stage store root: a folder or an fsspec URL such as "
        "s3://bucket/zhpipe (default: ZHPIPE_STORAGE, else the pipeline's `storage`, else "
        "the project's data/)",
    )
