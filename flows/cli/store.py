"""`zhpipe verify` and `gc`: the stage store's health and size."""

from __future__ import annotations

import shlex
import time

from flows.cli.common import store_of
from flows.needs import Needs
from flows.plan import project
from tasks.errors import ZhpipeError


def cmd_verify(args) -> int:
    from flows.plan.maintenance import verify_store

    store = store_of(args)
    rows = verify_store(store)
    bad = [r for r in rows if r["problems"]]
    for r in bad:
        print(f"{r['stage']}/{r['key']}: " + "; ".join(r["problems"][:3]))
    print(
        f"{len(rows)} outputs checked in {store.url}: {len(rows) - len(bad)} sound, {len(bad)} "
        "corrupt"
        + (
            " (`zhpipe run` rebuilds them; `zhpipe gc` removes what no pipeline uses)"
            if bad
            else ""
        )
    )
    return 1 if bad else 0


def _source_paths(config) -> list:
    """The local files and folders a pipeline reads its corpus from (gc never removes them)."""
    from flows.plan.sources import resolve_local

    parts = [config.source, *config.source.given().values()]
    return [p for p in (resolve_local(src.path) for src in parts if src.path) if p is not None]


def _registry(revision):
    """The registry as gc asks it: a model that is not registered yet is said in one line; the
    outputs that would read it cannot be in the store, so the key that names it keeps nothing
    (`<uri>@unregistered`)."""
    said = set()

    def lookup(uri: str) -> str:
        try:
            return revision(uri)
        except ZhpipeError as e:
            if uri not in said:
                said.add(uri)
                print(
                    f"gc: {e}; what a pipeline builds from it is not built yet, so nothing of it "
                    "is kept"
                )
            return f"{uri}@unregistered"

    return lookup


def cmd_gc(args) -> int:
    from flows.plan import leases
    from flows.plan.config import list_pipelines, load_pipeline
    from flows.plan.keys import plan_keys
    from flows.plan.maintenance import collect_garbage
    from flows.plan.sources import resolve_local, source_run_record, source_run_records
    from flows.track.champion import revision

    began = time.time()  # what is published after this was not planned by this gc: a live run's
    file = project.current().config_file
    configs = [load_pipeline(name, file) for name in list_pipelines(file)]
    from flows.plan.store import unit_folder

    keep = {
        (unit_folder(unit), key)
        for config in configs
        for unit, key in plan_keys(config, registry=_registry(revision)).items()
    }
    sources = tuple(path for config in configs for path in _source_paths(config))
    records = source_run_records()
    for name in args.forget:
        if name not in records:
            raise ZhpipeError(
                f"gc --forget {name}: no run on another corpus of that name (kept: "
                f"{', '.join(records) or 'none'})"
            )
        if not args.dry_run:
            source_run_record(name).unlink()
        del records[name]
    for name, record in records.items():  # runs on other corpora (`--source`): kept until forgotten
        keep |= {(unit_folder(unit), key) for unit, key in record.get("keys", {}).items()}
        sources += (
            tuple(p for p in [resolve_local(str(record["source"]))] if p is not None)
            if record.get("source")
            else ()
        )
        print(
            f"keeping what `{name}` built (zhpipe run --source {record.get('source')}); `zhpipe gc "
            "--forget "
            f"{shlex.quote(name)}` releases it"
        )
    store = store_of(args)
    kept: list[dict] = []
    # a shared store: the bucket itself, with every machine's leases and records of use
    if store.fs is not None:
        from flows.plan.maintenance import collect_remote

        records = leases.store_records(store)
        live = [r for r in records if r["live"]]
        removed = collect_remote(
            store, keep, args.dry_run, args.keep_days * 86400, began, kept, records
        )
    else:
        with leases.gc_lock(
            store,
            what=f"gc: a run is starting on {store.url}; waiting for it to record what it holds",
        ):
            live = leases.live(store)
            removed = collect_garbage(
                store,
                keep,
                dry_run=args.dry_run,
                protect=(project.current().root / "data" / "raw", *sources),
                live=live,
                since=began,
                kept=kept,
            )
    if not live:  # a live run may be logging a model now: its half-logged ones wait for the next gc
        removed += _half_logged(args.dry_run, began)
    for item in removed:
        print(
            f"{'would remove' if args.dry_run else 'removed'} {item['path']} ({item['mb']:.1f} MB, "
            f"{item['why']})"
        )
    for item in kept:
        print(f"kept {item['path']}: {item['why']}")
    total = sum(i["mb"] for i in removed)
    print(
        f"{len(removed)} items, {total:.1f} MB {'would be freed' if args.dry_run else 'freed'} in "
        f"{store.url}"
        + (
            f"; {len(kept)} kept for {len(live)} live run{'s' if len(live) != 1 else ''} (run gc "
            "again when they end)"
            if kept
            else ""
        )
    )
    return 0


def _half_logged(dry_run: bool, began: float) -> list[dict]:
    """The tracking store's models whose logging never finished
    (flows.track.runs.half_logged_models), removed."""
    from flows.track.runs import half_logged_models, remove_half_logged

    found = half_logged_models(began)
    if not dry_run:
        for item in found:
            remove_half_logged(item)
    return found


def cmd_accept(args) -> int:
    """Put partitions a blocking check held out back into the corpus (the next run builds them
    in)."""
    from flows.cli.common import load
    from flows.plan import held

    _partition_first(args)
    config = load(args)
    names = held.accept(config.identity, args.partitions, every=args.all)
    print(
        f"accepted {', '.join(names)}: the next `zhpipe run {shlex.quote(config.name)}` builds "
        f"{'them' if len(names) > 1 else 'it'} into the corpus"
    )
    return 0


def _partition_first(args) -> None:
    """`zhpipe accept night3.csv` in a project of one pipeline: the word is a partition, not a
    pipeline name."""
    from flows.cli.common import config_file
    from flows.plan.config import list_pipelines

    names = list(list_pipelines(config_file(args)))
    if args.pipeline and args.pipeline not in names:
        if len(names) != 1:
            raise ZhpipeError(
                f"{args.pipeline!r} is not a pipeline of {config_file(args)}; name the pipeline "
                "first "
                f"({', '.join(names)})"
            )
        args.partitions.insert(0, args.pipeline)
        args.pipeline = names[0]


def cmd_hold(args) -> int:
    """Take partitions that passed the checks out of the corpus (the next run rebuilds without
    them)."""
    from flows.cli.common import load
    from flows.plan import held
    from flows.plan.sources import partitions

    config = load(args)
    if not config.source.partitioned:
        raise ZhpipeError(
            f"hold: pipeline {config.name}'s source has no partitions (a folder, a glob or "
            f"a nightly export has)"
        )
    names = held.hold(
        config.identity, {p.name: p.fingerprint() for p in partitions(config)}, args.partitions
    )
    quoted = " ".join(shlex.quote(n) for n in names)
    print(
        f"held out {', '.join(names)}: the next `zhpipe run {shlex.quote(config.name)}` builds the "
        "corpus and every "
        f"split without {'them' if len(names) > 1 else 'it'} (the rows stay in the store); put "
        "back with "
        f"`zhpipe accept {shlex.quote(config.name)} {quoted}`"
    )
    return 0


def add_parsers(sub) -> None:
    from flows.cli.common import storage_arg

    verify = sub.add_parser(
        "verify",
        help="check every output in the stage store against its manifest (sizes and sha256)",
    )
    storage_arg(verify)
    verify.set_defaults(handler=cmd_verify)
    gc = sub.add_parser(
        "gc",
        help="remove outputs no pipeline in pipelines.yaml uses, and leftovers of killed builds",
    )
    storage_arg(gc)
    gc.add_argument(
        "--dry-run", action="store_true", help="show what would be removed, remove nothing"
    )
    gc.add_argument(
        "--keep-days",
        type=float,
        default=7.0,
        metavar="N",
        help="on an object store: keep what any run used or published within N days (default 7)",
    )
    gc.add_argument(
        "--forget",
        action="append",
        default=[],
        metavar="NAME",
        help="no longer keep what the run on another corpus NAME built (`zhpipe run --source`; "
        "repeatable)",
    )
    gc.set_defaults(handler=cmd_gc)
    from flows.cli.common import pipeline_args

    accept = sub.add_parser(
        "accept",
        help="put a partition (or a corpus) a blocking data check held out back into the corpus",
    )
    pipeline_args(accept)
    accept.add_argument(
        "partitions",
        nargs="*",
        metavar="PARTITION",
        help="held partitions, as `zhpipe status` names them",
    )
    accept.add_argument(
        "--all",
        action="store_true",
        help="every held partition (or the held corpus of a source without partitions)",
    )
    accept.set_defaults(handler=cmd_accept, needs=Needs(space=True))
    hold = sub.add_parser(
        "hold",
        help="take a partition that passed the data checks out of the corpus (accept's inverse)",
    )
    pipeline_args(hold)
    hold.add_argument(
        "partitions",
        nargs="+",
        metavar="PARTITION",
        help="partitions, as `zhpipe status` names them",
    )
    hold.set_defaults(handler=cmd_hold, needs=Needs(space=True))
