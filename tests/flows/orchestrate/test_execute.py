"""The task wrappers through the run engine (flows/orchestrate/execute.py): build, publish, track,
reuse; a failing build counts as nothing."""

import pandas as pd
import pytest

from flows.track.tracker import client
from tasks.errors import DataError


def stage(run, name, **inputs):
    """One stage's own unit through the run engine (built, or reused from the cache)."""
    return run.run(name, inputs, run.config.kind.stages[name].build)


def test_a_unit_builds_then_hits(run_ctx):
    d = stage(run_ctx, "download")
    assert d.cache == "miss" and d.rows == 300 and d.facts.labels == ["0", "1"]
    c = stage(run_ctx, "clean", download=d)
    assert c.cache == "miss" and (c.path / "quarantine.parquet").is_file()
    assert len(pd.read_parquet(c.path / "data.parquet")) == c.rows
    manifest = run_ctx.store.manifest("clean", c.key)
    assert manifest.inputs == {"download": d.key} and manifest.params["min_chars"] == 2
    again = stage(run_ctx, "clean", download=d)
    assert again.cache == "hit" and again.key == c.key
    run = client().get_run(manifest.mlflow_run_id)
    assert (
        run.data.tags["zhpipe.stage"] == "clean"
        and run.data.tags["mlflow.parentRunId"] == run_ctx.parent_run_id
    )
    assert run.info.status == "FINISHED"


def test_failing_build_leaves_no_output_and_a_failed_run(run_ctx):
    def broken(ctx):
        (ctx.out / "data.parquet").write_bytes(b"half")
        raise DataError("boom")

    with pytest.raises(DataError):
        run_ctx.run("clean", {}, broken)
    assert not run_ctx.store.is_done("clean", run_ctx.keys["clean"])
    exp = client().get_experiment_by_name(run_ctx.experiment)
    failed = client().search_runs([exp.experiment_id], filter_string="attributes.status = 'FAILED'")
    assert any(r.data.tags.get("zhpipe.stage") == "clean" for r in failed)


def test_scratch_survives_a_failed_build_until_publish_and_force_clears_it(run_ctx):
    """Checkpoints live in the stage key's scratch folder: kept after a failure (to resume), gone
    after publish."""
    from tasks.core import BuildOutput

    seen = []

    def flaky(ctx):
        seen.append(sorted(p.name for p in ctx.scratch.iterdir()))
        (ctx.scratch / "last.pt").write_text("epoch 1")
        if len(seen) == 1:
            raise DataError("killed")
        return BuildOutput(rows=0)

    with pytest.raises(DataError):
        run_ctx.run("clean", {}, flaky)
    run_ctx.run("clean", {}, flaky)
    assert seen == [[], ["last.pt"]]
    assert not run_ctx.store.scratch("clean", run_ctx.keys["clean"]).joinpath("last.pt").exists()
    seen.clear()
    run_ctx.store.scratch("clean", run_ctx.keys["clean"]).joinpath("last.pt").write_text(
        "from a killed run"
    )
    run_ctx.cache.force = {"clean"}
    with pytest.raises(DataError):
        run_ctx.run("clean", {}, flaky)
    assert seen == [[]]  # --force started from scratch, not from the checkpoint


def test_artifact_keys_are_valid_for_any_allowed_pipeline_name():
    import re

    from flows.orchestrate.tracking import artifact_key

    for name in ("chnsenticorp", "my_pipeline", "Reviews.v2", "a-b_c.D"):
        assert re.fullmatch(r"[a-z0-9-]+", artifact_key(name, "comparison")), name


def test_the_engine_calls_its_tracking_hooks_and_knows_nothing_else_of_them(tmp_path):
    """RunContext.tracking is the only seam between the run engine and MLflow: with other hooks a
    unit is built, published and reused, each hook called in its turn, and no MLflow run is made."""
    from flows.orchestrate.execute import RunContext
    from flows.plan.cache import StageCache
    from flows.plan.keys import plan
    from flows.plan.request import RunRequest
    from flows.plan.store import StageStore
    from tasks.core import BuildOutput

    calls = []

    class Recording:
        run_id = "recorded"
        sink = None

        def __init__(self, experiment, parent, unit, key, reused, *rest):
            calls.append(("start", str(unit), reused is not None))

        def building(self, system_metrics):
            import contextlib

            calls.append(("building", system_metrics))
            return contextlib.nullcontext()

        def built(self, folder, out, pipeline):
            calls.append(("built", (folder / "data.parquet").is_file()))

        def done(self, manifest, params):
            calls.append(("done", manifest.rows, "min_chars" in params()))

        def failed(self, params):
            calls.append(("failed", "min_chars" in params()))

    config = RunRequest("smoke").config()
    causes = plan(config, registry=lambda uri: uri)
    run = RunContext(
        config,
        StageCache(StageStore(tmp_path / "store")),
        StageCache.keys(causes),
        "zhpipe-hooks",
        None,
        causes=causes,
        tracking=Recording,
    )
    before = len(client().search_experiments())

    def build(ctx):
        pd.DataFrame({"text": ["好"]}).to_parquet(ctx.out / "data.parquet")
        return BuildOutput(rows=1)

    first, again = run.run("clean", {}, build), run.run("clean", {}, build)
    assert (
        first.cache == "miss"
        and again.cache == "hit"
        and first.run_id == again.run_id == "recorded"
    )
    assert run.store.manifest("clean", first.key).mlflow_run_id == "recorded"
    assert calls == [
        ("start", "clean", False),
        ("building", False),
        ("built", True),
        ("done", 1, True),
        ("start", "clean", True),
        ("done", 1, True),
    ]
    calls.clear()
    run.cache.force = {"clean"}
    with pytest.raises(DataError):
        run.run("clean", {}, lambda ctx: (_ for _ in ()).throw(DataError("boom")))
    assert calls == [("start", "clean", False), ("building", False), ("failed", True)]
    assert (
        len(client().search_experiments()) == before
        and client().get_experiment_by_name("zhpipe-hooks") is None
    )
