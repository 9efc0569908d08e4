"""task translation end to end through real Prefect and MLflow: two tiny translators trained each
way on 417 Tatoeba pairs, scored with sacrebleu, registered, served on raw text as they were
evaluated, and used by the back-translation augmenter of a classification pipeline (backend
zhpipe)."""

from pathlib import Path

import mlflow.pyfunc
import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.plan.config import load_pipeline
from flows.plan.fingerprint import file_fingerprints
from flows.plan.store import StageStore
from flows.track.serving import score_served
from flows.track.tracker import client

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]
TINY = (
    "{epochs: 2, embed_dim: 16, hidden_size: 32, beam_size: 2}",
    "{epochs: 2, d_model: 32, num_heads: 2, num_encoder_layers: 1, num_decoder_layers: 1, ff_dim: "
    "64, beam_size: 2}",
)
PIPELINES = f"""
pipelines:
  mt-zh-en:
    task: translation
    source: {{path: tests/fixtures/mt/pairs.tsv, format: tsv}}
    stages:
      vocab: {{min_freq: 1}}
      train: {{direction: zh-en, seq2seq: {TINY[0]}, seq2seq_attention: {TINY[0]},
              transformer_mt: {TINY[1]}}}
  mt-en-zh:
    task: translation
    source: {{path: tests/fixtures/mt/pairs.tsv, format: tsv}}
    stages:
      vocab: {{min_freq: 1}}
      train: {{direction: en-zh, models: [seq2seq_attention], seq2seq_attention: {TINY[0]}}}
  bt-local:
    source: {{path: tests/fixtures/smoke.csv, format: csv, text_column: review,
              label_column: label}}
    stages:
      augment:
        method: backtranslation
        backtranslation:
          backend: zhpipe
          pivots:
            - {{lang: en, forward: "models:/zhpipe-mt-zh-en@champion",
               backward: "models:/zhpipe-mt-en-zh@champion"}}
          max_rows: 20
          split_chars: 30
          filters: {{min_length_ratio: 0.0, max_length_ratio: 100, min_similarity: 0.0,
                    max_similarity: 1.0, min_chinese: 0.0}}
      train: {{models: [tfidf_lr]}}
"""


@pytest.fixture(scope="module")
def mt(prefect_harness, tmp_path_factory):
    folder = tmp_path_factory.mktemp("mt")
    config = folder / "pipelines.yaml"
    config.write_text(PIPELINES, encoding="utf-8")
    store = folder / "store"
    return {
        "config": config,
        "store": store,
        "out": pipeline_flow("mt-zh-en", config_file=str(config), storage=str(store)),
    }


def paths(out):
    return {u["stage"]: Path(u["path"]) for u in out["stages"] + out["units"]}


def test_three_translators_are_trained_scored_with_sacrebleu_and_the_best_registered(mt):
    out = mt["out"]
    assert [r["stage"] for r in out["stages"]] == [
        "download",
        "clean",
        "split",
        "segment",
        "profile",
        "augment",
        "vocab",
        "train",
        "evaluate",
    ]
    c = client()
    parent = c.get_run(out["parent_run_id"])
    assert (
        parent.data.tags["zhpipe.task"] == "translation"
        and parent.data.tags["zhpipe.registered"] == "zhpipe-mt-zh-en/1"
    )
    assert {"best_test_bleu", "best_test_chrf"} <= set(parent.data.metrics)
    runs = c.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'",
    )
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert set(models) == {"seq2seq", "seq2seq_attention", "transformer_mt"}
    for name, r in models.items():
        assert {"test_bleu", "test_chrf", "val_bleu"} <= set(r.data.metrics), name
        assert (
            r.data.tags["zhpipe.bleu_signature"].startswith("nrefs:1|")
            and "tok:13a" in r.data.tags["zhpipe.bleu_signature"]
        )
    best = parent.data.tags["zhpipe.best_model"]
    # chosen on validation
    assert models[best].data.metrics["val_bleu"] == max(
        r.data.metrics["val_bleu"] for r in models.values()
    )
    found = paths(out)
    for name in models:
        files = {p.name for p in (found[f"evaluate.{name}"] / "evaluation").iterdir()}
        assert {
            "bleu_by_length.csv",
            "worst_translations.csv",
            "translations.csv",
            "metrics.json",
        } <= files
        # a heat map where there is attention
        assert ("attention.png" in files) == (name != "seq2seq")
    split = found["split"]
    test, train = (pd.read_parquet(split / f"{s}.parquet") for s in ("test", "train"))
    assert not set(test["en"]) & set(train["en"]) and not set(test["text"]) & set(train["text"])


def test_the_registered_translator_answers_raw_text_as_it_was_evaluated(mt):
    uri = "models:/zhpipe-mt-zh-en@champion"
    answers = mlflow.pyfunc.load_model(uri).predict(["我们明天去北京。", None, "   "])
    assert answers["status"].tolist() == ["ok", "missing", "empty"]
    assert (
        isinstance(answers["translation"][0], str)
        and answers["translation"][0]
        and pd.isna(answers["translation"][1])
    )
    parent = client().get_run(mt["out"]["parent_run_id"])
    best = parent.data.tags["zhpipe.best_model"]
    test = pd.read_parquet(paths(mt["out"])["split"] / "test.parquet")
    evaluated = pd.read_json(
        paths(mt["out"])[f"evaluate.{best}"] / "evaluation" / "metrics.json", typ="series"
    )["test_bleu"]
    assert score_served(uri, test, "bleu", store=StageStore(mt["store"])) == pytest.approx(
        evaluated, abs=1e-6
    )


def test_the_other_direction_reuses_every_data_stage(mt):
    out = pipeline_flow("mt-en-zh", config_file=str(mt["config"]), storage=str(mt["store"]))
    cache = {r["stage"]: r["cache"] for r in out["stages"]}
    assert (
        all(cache[s] == "hit" for s in ("download", "clean", "split", "segment", "vocab"))
        and cache["train"] == "miss"
    )
    parent = client().get_run(out["parent_run_id"])
    assert parent.data.tags["zhpipe.registered"] == "zhpipe-mt-en-zh/1"
    answer = mlflow.pyfunc.load_model("models:/zhpipe-mt-en-zh@champion").predict(
        ["We will go to Beijing tomorrow."]
    )
    assert answer["status"][0] == "ok" and answer["translation"][0]


def test_back_translation_with_the_registered_translators(mt):
    from flows.track.champion import revision

    config = load_pipeline("bt-local", mt["config"])
    files = file_fingerprints(
        config.stages.augment.model_dump(mode="json"),
        ("backtranslation.pivots.*.forward", "backtranslation.pivots.*.backward"),
        ROOT,
        registry=revision,
    )
    assert files == {
        "models:/zhpipe-mt-zh-en@champion": "registry:zhpipe-mt-zh-en/1",
        "models:/zhpipe-mt-en-zh@champion": "registry:zhpipe-mt-en-zh/1",
    }
    out = pipeline_flow(
        "bt-local",
        config_file=str(mt["config"]),
        storage=str(mt["store"]),
        stages=["download", "clean", "split", "segment", "augment"],
    )
    augment = next(r for r in out["stages"] if r["stage"] == "augment")
    assert augment["facts"]["augment_method_used"] == "backtranslation"
    assert augment["metrics"]["candidates"] == 20 and augment["metrics"]["rows_added"] >= 1
    added = pd.read_parquet(Path(augment["path"]) / "train.parquet").query(
        "aug_method == 'backtranslation'"
    )
    assert set(added["model_forward"]) == {"models:/zhpipe-mt-zh-en/1"} and set(
        added["model_backward"]
    ) == {"models:/zhpipe-mt-en-zh/1"}


def test_a_registered_model_that_is_not_there_is_one_clear_error(mt):
    from tasks.errors import ZhpipeError

    overrides = [
        "augment.backtranslation.pivots=[{lang: en, forward: 'models:/zhpipe-nothing@champion', "
        "backward: 'models:/zhpipe-mt-en-zh@champion'}]"
    ]
    with pytest.raises(
        ZhpipeError, match="models:/zhpipe-nothing@champion: no such registered model"
    ):
        pipeline_flow(
            "bt-local",
            overrides=overrides,
            config_file=str(mt["config"]),
            storage=str(mt["store"]),
            stages=["augment"],
        )
