"""End-to-end: the smoke pipeline through real Prefect (temporary server) and real MLflow
(SQLite)."""

import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow, select_stages
from flows.plan.config import load_pipeline
from flows.track.tracker import client
from tasks.errors import ZhpipeError
from tasks.stages import STAGE_NAMES as STAGES
from tests.helpers.runs import without_profile

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def store(smoke):
    return smoke["store"]


def run(store, overrides=(), **kw):
    return pipeline_flow("smoke", overrides=list(overrides), storage=str(store), **kw)


def cache_of(out):
    return {r["stage"]: r["cache"] for r in out["stages"]}


def children(parent_id, experiment):
    c = client()
    exp = c.get_experiment_by_name(experiment)
    return c.search_runs(
        [exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )


def test_first_run_builds_everything_and_tracks_it(smoke):
    out = smoke["out"]
    assert set(cache_of(out).values()) == {"miss"} and list(cache_of(out)) == list(STAGES)
    c = client()
    parent = c.get_run(out["parent_run_id"])
    tags = parent.data.tags
    assert tags["zhpipe.pipeline"] == "smoke" and len(tags["zhpipe.config_hash"]) == 12
    assert len(tags["zhpipe.source_sha256"]) == 64 and "zhpipe.git_commit" in tags
    assert tags["zhpipe.best_model"] in ("fasttext", "textcnn")
    assert 0 <= parent.data.metrics["best_test_accuracy"] <= 1
    assert parent.data.params["train.epochs"] == "1"
    runs = children(out["parent_run_id"], out["experiment"])
    stages = {r.data.tags["zhpipe.stage"]: r for r in runs if "zhpipe.stage" in r.data.tags}
    # a model run per train unit
    assert set(stages) == set(STAGES) | {"train.fasttext", "train.textcnn"}
    assert {r.data.tags["zhpipe.cache"] for r in stages.values()} == {"miss"}
    assert stages["clean"].inputs.dataset_inputs[0].dataset.name == "smoke-clean"
    assert "dropped_duplicate" in stages["clean"].data.metrics
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert set(models) == {"fasttext", "textcnn"}
    for r in models.values():
        assert {"test_accuracy", "test_macro_f1"} <= set(r.data.metrics)
    import mlflow

    # raw text in, as logged
    served = mlflow.pyfunc.load_model(models["textcnn"].data.tags["zhpipe.model_uri"])
    assert list(served.predict(["房间很干净"]).columns[:2]) == ["label", "probability"]


def test_runs_read_well_in_both_uis(smoke):
    """MLflow: a model run logs each curve once (no `textcnn_train_loss` beside `train_loss`); the
    parent run's params leave out models it does not train, the whole config is config.json.
    Prefect: every model unit is a task run of its own."""
    import asyncio
    import json

    import mlflow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    out = smoke["out"]
    c = client()
    runs = children(out["parent_run_id"], out["experiment"])
    textcnn = next(
        r
        for r in runs
        if r.data.tags.get("zhpipe.model") == "textcnn" and "zhpipe.stage" in r.data.tags
    )
    assert "train_loss" in textcnn.data.metrics and not any(
        k.startswith("textcnn_") for k in textcnn.data.metrics
    )
    # one epoch, logged once
    assert [m.step for m in c.get_metric_history(textcnn.info.run_id, "train_loss")] == [1]
    parent = c.get_run(out["parent_run_id"])
    # model runs of two pipeline runs read apart
    assert textcnn.info.run_name == f"textcnn · {parent.info.run_name}"
    assert "train.textcnn.num_filters" in parent.data.params and not any(
        k.startswith("train.bert.") for k in parent.data.params
    )
    # on this run, or the first with its config
    config = json.loads(mlflow.artifacts.load_text(parent.data.tags["zhpipe.config_json"]))
    assert config["name"] == "smoke" and "bert" in config["stages"]["train"]

    async def names():
        async with get_client() as client:
            found = await client.read_task_runs(
                task_run_filter=TaskRunFilter(
                    name=TaskRunFilterName(any_=["train.textcnn", "evaluate.textcnn"])
                )
            )
            return {t.name for t in found}

    assert asyncio.run(names()) == {"train.textcnn", "evaluate.textcnn"}


def test_rerun_is_all_hits_recorded_in_one_run_naming_the_builders(smoke, store):
    """A run with nothing to build records its parent run alone; each reused output names the run
    that built it, which `compare` follows for the models' metrics; the champion rule still runs,
    and says the model it reuses is already the champion (made so here: other modules register
    better models of zhpipe-smoke into this registry)."""
    from flows.track.runs import find_run, model_metrics

    name, version = (
        client().get_run(smoke["out"]["parent_run_id"]).data.tags["zhpipe.registered"].split("/")
    )
    before = client().get_model_version_by_alias(name, "champion").version
    client().set_registered_model_alias(name, "champion", version)
    try:
        out = run(store)
    finally:
        client().set_registered_model_alias(name, "champion", before)
    assert set(cache_of(out).values()) == {"hit"} and {u["cache"] for u in out["units"]} == {"hit"}
    assert children(out["parent_run_id"], out["experiment"]) == []
    parent = client().get_run(out["parent_run_id"])
    assert parent.data.tags["zhpipe.reused"] == "all" and parent.data.metrics["stages_hit"] == len(
        STAGES
    )
    for stage in STAGES:
        builder = client().get_run(parent.data.tags[f"zhpipe.reused.{stage}"])
        assert (
            builder.data.tags["zhpipe.stage"] == stage
            and builder.data.tags["zhpipe.cache"] == "miss"
        )
    assert "test_accuracy" in model_metrics(find_run(out["parent_run_id"]))["textcnn"]
    assert (
        parent.data.tags["zhpipe.registered"] == f"{name}/{version}"
        and parent.data.tags["zhpipe.champion"] == "already"
    )


def test_changed_train_param_rebuilds_train_and_evaluate_only(prefect_harness, store):
    out = run(store, ["train.epochs=2"])
    assert [s for s, c in cache_of(out).items() if c == "miss"] == ["train", "evaluate"]


def test_one_models_param_rebuilds_that_model_only(prefect_harness, store):
    """Each model is a unit: textcnn's own param retrains and rescores textcnn; fastText is
    reused."""
    out = run(store, ["train.textcnn.num_filters=8"])
    units = {u["stage"]: u["cache"] for u in out["units"]}
    assert units == {
        "train.fasttext": "hit",
        "train.textcnn": "miss",
        "evaluate.fasttext": "hit",
        "evaluate.textcnn": "miss",
    }
    # they gather their units
    assert [s for s, c in cache_of(out).items() if c == "miss"] == ["train", "evaluate"]
    runs = children(out["parent_run_id"], out["experiment"])
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert (
        models["fasttext"].data.tags["zhpipe.cache"] == "hit"
        and models["textcnn"].data.tags["zhpipe.cache"] == "miss"
    )
    # a reused model is still scored in this run
    assert "test_accuracy" in models["fasttext"].data.metrics


def test_only_reuses_cached_inputs_and_refuses_missing_ones(prefect_harness, store):
    out = run(store, stages=select_stages(only="vocab"), force=["vocab"])
    assert cache_of(out) == {"vocab": "miss"}
    with pytest.raises(ZhpipeError, match="stage 'segment' has no cached output"):
        run(store, ["segment.mode=search"], stages=select_stages(only="vocab"))


def test_force_rebuilds_from_stage_on(prefect_harness, store):
    out = run(store, force=["embed"])
    assert [s for s, c in cache_of(out).items() if c == "miss"] == ["embed", "train", "evaluate"]


def _augment_run(out):
    runs = children(out["parent_run_id"], out["experiment"])
    return next(r for r in runs if r.data.tags.get("zhpipe.stage") == "augment")


def test_backtranslation_through_the_flow_with_tiny_models(prefect_harness, tmp_path):
    from tests.helpers.tiny_marian import build_pair

    zh_en, en_zh = build_pair(tmp_path / "models")
    sets = [
        "augment.method=backtranslation",
        f"augment.backtranslation.pivots=[{{lang: en, forward: '{zh_en}', backward: '{en_zh}'}}]",
        "augment.backtranslation.max_length=12",
        "augment.backtranslation.num_beams=1",
        "augment.backtranslation.max_rows=30",
    ]
    out = run(tmp_path / "store", sets, stages=without_profile("augment"))
    r = _augment_run(out)
    assert r.data.tags["zhpipe.augment.method_used"] == "backtranslation"
    assert r.data.metrics["candidates"] == 30 and r.data.metrics["cache_misses"] > 0
    arts = {a.path for a in client().list_artifacts(r.info.run_id)}
    assert {"augment_sample.json", "sample.csv"} <= arts
    again = run(tmp_path / "store", sets, stages=select_stages(only="augment"), force=["augment"])
    assert _augment_run(again).data.metrics["cache_hit_rate"] == 1.0


def test_missing_models_fall_back_to_eda_and_say_so(prefect_harness, tmp_path):
    sets = ["augment.method=backtranslation", "augment.fallback=eda"]
    out = run(tmp_path / "store", sets, stages=without_profile("augment"))
    r = _augment_run(out)
    assert r.data.tags["zhpipe.augment.method_used"] == "eda"
    assert r.data.metrics["backtranslation_missing_model"] == 1 and r.data.metrics["rows_added"] > 0


def test_language_models_and_baseline_through_the_flow(prefect_harness, store):
    sets = ["train.models=[tfidf_lr, ngram_lm, lm_classifier]"]
    out = run(store, sets, stages=select_stages(start="train"))
    assert cache_of(out) == {"train": "miss", "evaluate": "miss"}
    runs = children(out["parent_run_id"], out["experiment"])
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert set(models) == {"tfidf_lr", "ngram_lm", "lm_classifier"}
    assert models["ngram_lm"].data.metrics["test_perplexity"] > 1
    for name in ("tfidf_lr", "lm_classifier"):
        assert 0 <= models[name].data.metrics["test_accuracy"] <= 1


def test_model_zoo_through_the_flow_with_curves_and_served_models(prefect_harness, store):
    """transformer, bert (masked-LM pretrained here, with the word adapter) and rnn_lm in one run:
    per-epoch curves in their MLflow runs, and each PyTorch classifier logged as an MLflow model
    that predicts like the code."""
    import mlflow
    import numpy as np
    import pandas as pd

    from flows.plan.keys import plan_keys
    from tasks.stages import MODELS

    sets = [
        "train.models=[transformer, bert, rnn_lm]",
        "train.epochs=2",
        "train.bert.pretrain_epochs=1",
        "train.bert.hidden_size=32",
        "train.bert.num_heads=2",
        "train.bert.num_layers=2",
        "train.bert.intermediate_size=64",
        "train.bert.word_adapter=true",
        "train.bert.adapter_layer=0",
        "train.rnn_lm.hidden_size=32",
        "train.embeddings=fasttext",
        "train.transformer.num_heads=2",
    ]  # smoke's fastText vectors: 30 dimensions
    out = run(store, sets, stages=select_stages(start="train"))
    runs = children(out["parent_run_id"], out["experiment"])
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert set(models) == {"transformer", "bert", "rnn_lm"}
    train_info = next(s for s in out["stages"] if s["stage"] == "train")["facts"]["models"]
    assert (
        train_info["transformer"]["embeddings"] == "fasttext"
        and train_info["transformer"]["embedding_coverage"] > 0.9
    )
    c = client()
    curves = {
        ("transformer", "val_macro_f1"): [1, 2],
        ("bert", "val_macro_f1"): [1, 2],
        ("bert", "mlm_val_mlm_loss"): [1],
        ("rnn_lm", "val_perplexity"): [1, 2],
        ("transformer", "lr"): [1, 2],
        ("bert", "samples_per_second"): [1, 2],
    }
    for (name, metric), steps in curves.items():
        assert [m.step for m in c.get_metric_history(models[name].info.run_id, metric)] == steps, (
            name,
            metric,
        )
    assert models["rnn_lm"].data.metrics["test_perplexity"] > 1
    keys = plan_keys(load_pipeline("smoke", overrides=sets))
    test = pd.read_parquet(store / "segment" / keys["segment"] / "test.parquet").head(2)
    # the logged classifier takes raw text and predicts like the training code
    for name in ("transformer", "bert"):
        model_dir = store / f"train.{name}" / keys[f"train.{name}"] / name
        served = mlflow.pyfunc.load_model(models[name].data.tags["zhpipe.model_uri"]).predict(
            test["text"].tolist()
        )
        np.testing.assert_allclose(
            served[["p_0", "p_1"]].to_numpy(), MODELS[name].load(model_dir)(test), atol=1e-5
        )


def _files(root, stage, key):
    import hashlib

    folder = root / stage / key
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.parquet"))
    }


def test_dask_run_writes_the_same_bytes_as_a_local_run(prefect_harness, store, tmp_path):
    """`--dask local`: clean, segment and augment run their chunks on a 2-worker LocalCluster and
    publish byte-identical files to the (cached) single-machine run of the same config."""
    from flows.plan.keys import plan_keys

    out = run(
        tmp_path / "dask-store",
        stages=without_profile("augment"),
        dask="local",
        overrides=["segment.chunk_rows=100"],
    )
    local = run(
        tmp_path / "local-store",
        stages=without_profile("augment"),
        overrides=["segment.chunk_rows=100"],
    )
    keys = plan_keys(load_pipeline("smoke", overrides=["segment.chunk_rows=100"]))
    for stage in ("clean", "segment", "augment"):
        dask_files = _files(tmp_path / "dask-store", stage, keys[stage])
        assert dask_files and dask_files == _files(tmp_path / "local-store", stage, keys[stage]), (
            stage
        )
    segment = {r["stage"]: r for r in out["stages"]}["segment"]
    assert segment["metrics"]["chunk_processes"] == 2  # both cluster workers ran chunks
    assert {r["stage"]: r for r in local["stages"]}["segment"]["metrics"]["chunk_processes"] >= 1


def test_remote_storage_url(prefect_harness, tmp_path):
    """A store on an fsspec URL (memory://, in this process): outputs are uploaded with their
    manifest last, a rerun is all hits, and a second machine (another local mirror) reads them
    back."""
    import fsspec

    from flows.plan.keys import plan_keys
    from flows.plan.store import StageStore

    url = f"memory://zhpipe-{tmp_path.name}"
    stages = select_stages(stop="segment")
    out = run(url, stages=stages)
    assert set(cache_of(out).values()) == {"miss"}
    fs = fsspec.filesystem("memory")
    keys = plan_keys(load_pipeline("smoke"))
    assert fs.exists(f"/zhpipe-{tmp_path.name}/segment/{keys['segment']}/manifest.json")
    assert set(cache_of(run(url, stages=stages)).values()) == {"hit"}
    other = StageStore(url, cache=tmp_path / "other-machine")
    folder = other.local("segment", keys["segment"])
    assert folder.is_relative_to(tmp_path / "other-machine")
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "test.parquet",
        "train.parquet",
        "validation.parquet",
    ]


def test_pictures_of_a_run_are_valid_pngs(prefect_harness, store):
    """The profile, embed and evaluate pictures of the smoke run: real PNGs of a sensible size, and
    the profile's one-page report and the projector export next to them."""
    from PIL import Image

    from flows.plan.keys import plan_keys

    keys = plan_keys(load_pipeline("smoke"))
    profile, embed = (store / s / keys[s] for s in ("profile", "embed"))
    evaluation = store / "evaluate.textcnn" / keys["evaluate.textcnn"]
    pictures = [
        profile / n
        for n in (
            "label_distribution.png",
            "length_distribution.png",
            "length_scatter.png",
            "top_words.png",
            "top_adjectives.png",
        )
    ]
    pictures += sorted(profile.glob("wordcloud_*.png")) + [embed / "word2vec_pca.png"]
    pictures += [
        evaluation / "evaluation" / n
        for n in ("confusion_matrix.png", "pr_curves.png", "training_curves.png")
    ]
    assert len(list(profile.glob("wordcloud_*.png"))) == 2  # one per label
    for path in pictures:
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert (
                img.format == "PNG" and 300 <= img.size[0] <= 4000 and 200 <= img.size[1] <= 4000
            ), (
                path.name,
                img.size,
            )
    assert (profile / "report.html").stat().st_size > 10_000
    vectors = (embed / "projector" / "vectors.tsv").read_text(encoding="utf-8").splitlines()
    words = (embed / "projector" / "metadata.tsv").read_text(encoding="utf-8").splitlines()
    # smoke's Word2Vec: 32 dimensions
    assert len(vectors) == len(words) > 10 and len(vectors[0].split("\t")) == 32
    assert (
        'tensor_path: "vectors.tsv"' in (embed / "projector" / "projector_config.pbtxt").read_text()
    )
    mistakes = pd.read_csv(evaluation / "evaluation" / "worst_mistakes.csv")
    assert list(mistakes.columns) == ["id", "text", "true", "predicted", "confidence"]
    assert (mistakes["true"] != mistakes["predicted"]).all() and mistakes[
        "confidence"
    ].is_monotonic_decreasing


def test_profile_is_built_beside_the_training_and_its_failure_fails_the_run(smoke, store):
    """The profile stage (`beside` in its kind) builds in a process of its own while the models
    train: its MLflow run starts after embed's and overlaps the first model's. Its error still
    ends the run, in one line of its own."""
    from tasks.errors import DataError

    out = smoke["out"]
    found = children(out["parent_run_id"], out["experiment"])
    runs = {r.data.tags.get("zhpipe.stage"): r.info for r in found}
    models = (runs["train.fasttext"], runs["train.textcnn"])
    profile, first = runs["profile"], min(models, key=lambda r: r.start_time)
    assert runs["embed"].end_time <= profile.start_time < first.end_time, (profile, first)
    assert [s["stage"] for s in out["stages"]] == list(STAGES)  # the summary keeps graph order

    with pytest.raises(DataError, match="no such font file"):
        run(store, ["profile.font=/nonexistent/font.ttf"])
