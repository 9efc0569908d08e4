"""`zhpipe init`, `pipelines`, `stages` and `models`: a project and what it declares."""

from __future__ import annotations

import shlex
from pathlib import Path

from flows.cli.common import config_file
from flows.needs import Needs
from tasks.errors import ZhpipeError, printable


def cmd_stages(args) -> int:
    from tasks.stages import KINDS

    for kind in KINDS.values():
        print(f"task {kind.name} ({kind.about}):")
        for stage in kind.stages.values():
            units = " (a unit per model)" if stage.per_model else ""
            print(
                f"  {stage.name:<9} <- {', '.join(stage.needs) or 'source':<30} {stage.help}{units}"
            )
    return 0


def cmd_models(args) -> int:
    """Every model a pipeline may name, with where it comes from: zhpipe, an installed package's
    family (entry point `zhpipe.models`), or this project's pipelines.yaml (a team's own
    estimator)."""
    from tasks.models.families import FOUND
    from tasks.stages import KINDS, MODELS

    declared = _declared_here()
    rows = [
        (
            name,
            "language model"
            if spec.is_language_model
            else f"{KINDS[spec.task].flavour} ({spec.task})",
            declared.get(name) or FOUND.get(name, "zhpipe"),
            spec.about,
        )
        for name, spec in MODELS.items()
    ]
    width = [max(len(r[i]) for r in rows) for i in (0, 1, 2)]
    print(f"{'model':<{width[0]}}  {'kind':<{width[1]}}  {'from':<{width[2]}}  about")
    for name, kind, origin, about in rows:
        print(printable(f"{name:<{width[0]}}  {kind:<{width[1]}}  {origin:<{width[2]}}  {about}"))
    return 0


def _declared_here() -> dict[str, str]:
    """The team's own models the current project's pipelines declare, by name: `pipelines.yaml
    (<pipeline>)`. Read (and so registered) here; a project whose config does not load lists
    none."""
    from flows.plan.config import list_pipelines, load_pipeline
    from flows.plan.project import current

    try:
        file = current().config_file
        found = {}
        for pipeline in list_pipelines(file):
            config = load_pipeline(pipeline, file)
            training = config.kind.training
            for name in config.section(training.name).own_models() if training else {}:
                found.setdefault(name, f"{file.name} ({pipeline})")
        return found
    except (ZhpipeError, OSError):
        return {}


def cmd_pipelines(args) -> int:
    from flows.plan.config import list_pipelines

    for name, description in list_pipelines(config_file(args)).items():
        print(printable(f"{name:<20} {description}"))
    return 0


def cmd_init(args) -> int:
    from flows.plan.init import init_project, starters

    every = starters()
    given = [(option, getattr(args, option)) for option in every if getattr(args, option, None)]
    if len(given) > 1:
        raise ZhpipeError(f"init: give one corpus (--{given[0][0]} and --{given[1][0]} were given)")
    option, corpus = given[0] if given else (None, None)
    fields = {a: getattr(args, a) for a in every[option].defaults()} if option else {}
    written = init_project(
        Path(args.dir),
        Path(corpus) if corpus else None,
        option,
        args.link,
        args.text_column,
        args.label_column,
        **fields,
    )
    for path in written:
        print(f"wrote {path}")
    if option and every[option].folder and not args.link:
        drops = Path(args.dir).expanduser().resolve() / "data" / "raw" / Path(corpus).name
        print(
            f"new nights go to {drops}/ (a copy of {corpus}; `zhpipe init --{option} FOLDER "
            "--link` reads them where they are)"
        )
    print(f"next: cd {shlex.quote(str(args.dir))} && zhpipe run")
    return 0


def _starter_args(init) -> None:
    """Each kind's starters (tasks/<kind>/__init__.py), the default kind's first: its corpus flag
    and its options."""
    from flows.plan.init import starters

    seen = set()
    for starter in starters().values():
        init.add_argument(
            f"--{starter.option}", metavar="FOLDER" if starter.folder else "FILE", help=starter.help
        )
        for flag, default, about in starter.options:
            if flag not in seen:
                seen.add(flag)
                init.add_argument(flag, default=default, help=about)


def add_parsers(sub) -> None:
    sub.add_parser("stages", help="list the stages, what each reads and does").set_defaults(
        handler=cmd_stages
    )
    models = sub.add_parser("models", help="list the registered models (names for train.models)")
    models.set_defaults(handler=cmd_models)
    pipelines = sub.add_parser("pipelines", help="list the pipelines in pipelines.yaml")
    pipelines.add_argument("--config", type=Path, help="pipelines file")
    pipelines.set_defaults(handler=cmd_pipelines)
    init = sub.add_parser(
        "init", help="write a starter project (pipelines.yaml for your CSV) into DIR"
    )
    init.add_argument(
        "dir", nargs="?", default=".", help="the project folder (default: the current one)"
    )
    init.add_argument("--text-column", default="text", help="the CSV's text column (default text)")
    init.add_argument(
        "--label-column", default="label", help="the CSV's label column (default label)"
    )
    init.later(_starter_args)
    init.add_argument(
        "--link",
        action="store_true",
        help="link the CSV into data/raw/ instead of copying it (its sha256 is pinned either way)",
    )
    init.set_defaults(handler=cmd_init, needs=Needs(project=False))
