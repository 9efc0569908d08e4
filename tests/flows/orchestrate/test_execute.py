"""The task wrappers through the run engine (flows/orchestrate/execute.py): build, publish, track, reuse; a failing build counts as nothing."""
import pandas as pd
import pytest

from flows.orchestrate.pipeline import stage_task
from flows.track.tracker import client
from tasks.errors import DataError

download, clean = stage_task("download"), stage_task("clean")


def test_task_fn_builds_then_hits(run_ctx):
    d = download.fn(run_ctx)
    assert d.cache == "miss" and d.rows == 300 and d.facts.labels == ["0", "1"]
    c = clean.fn(run_ctx, d)
    assert c.cache == "miss" and (c.path / "quarantine.parquet").is_file()
    assert len(pd.read_parquet(c.path / "data.parquet")) == c.rows
    manifest = run_ctx.store.manifest("clean", c.key)
    assert manifest.inputs == {"download": d.key} and manifest.params["min_chars"] == 2
    again = clean.fn(run_ctx, d)
    assert again.cache == "hit" and again.key == c.key
    run = client().get_run(manifest.mlflow_run_id)
    assert run.data.tags["zhpipe.stage"] == "clean" and run.data.tags["mlflow.parentRunId"] == run_ctx.parent_run_id
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
    """Checkpoints live in the stage key's scratch folder: kept after a failure (to resume), gone after publish."""
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
    run_ctx.store.scratch("clean", run_ctx.keys["clean"]).joinpath("last.pt").write_text("from a killed run")
    run_ctx.force = {"clean"}
    with pytest.raises(DataError):
        run_ctx.run("clean", {}, flaky)
    assert seen == [[]]  # --force started from scratch, not from the checkpoint


def test_artifact_keys_are_valid_for_any_allowed_pipeline_name():
    import re

    from flows.orchestrate.tracking import artifact_key

    for name in ("chnsenticorp", "my_pipeline", "Reviews.v2", "a-b_c.D"):
        assert re.fullmatch(r"[a-z0-9-]+", artifact_key(name, "comparison")), name
