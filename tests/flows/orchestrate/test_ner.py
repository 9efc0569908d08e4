"""task ner end to end: the ner-smoke pipeline (230 Resume NER sentences with their own dev and test
files) through real Prefect and MLflow, the registered tagger on raw text and the config rules of
the task (the stages alone: tests/tasks/ner/)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.plan.config import load_pipeline
from flows.track.tracker import client
from tasks.errors import ConfigError
from tasks.ner.tagging import parse_conll
from tasks.stages import MODELS
from tasks.stages import STAGE_NAMES as STAGES

pytestmark = pytest.mark.e2e
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ner"


@pytest.fixture(scope="module")
def ner_run(prefect_harness, tmp_path_factory):
    store = tmp_path_factory.mktemp("ner-store")
    return {"store": store, "out": pipeline_flow("ner-smoke", storage=str(store))}


def cache_of(out):
    return {r["stage"]: r["cache"] for r in out["stages"]}


def test_ner_pipeline_runs_every_stage_and_tracks_it_like_classification(ner_run):
    out = ner_run["out"]
    assert list(cache_of(out)) == list(STAGES) and set(cache_of(out).values()) == {"miss"}
    c = client()
    parent = c.get_run(out["parent_run_id"])
    assert (
        parent.data.tags["zhpipe.task"] == "ner" and parent.data.tags["zhpipe.best_model"] in MODELS
    )
    # the crf alone reaches ~0.8 on these 150 sentences
    assert 0.5 < parent.data.metrics["best_test_f1"] <= 1
    assert parent.data.tags["zhpipe.registered"].startswith("zhpipe-ner-smoke/")
    runs = c.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'",
    )
    models = {r.data.tags["zhpipe.model"]: r for r in runs if "zhpipe.model" in r.data.tags}
    assert set(models) == {"crf", "bilstm_crf", "lexicon_tagger", "ner_ensemble"}
    for name, r in models.items():
        assert {"test_f1", "test_precision", "test_recall", "val_f1_best"} <= set(r.data.metrics), (
            name
        )
        assert r.data.tags["zhpipe.model_uri"].startswith("models:/")
    # per-epoch curves of the neural taggers, and they learn
    for name in ("bilstm_crf", "lexicon_tagger"):
        history = c.get_metric_history(models[name].info.run_id, "val_f1")
        assert len(history) == 4 and history[-1].value > 0.1, name
    paths = {u["stage"]: Path(u["path"]) for u in out["stages"] + out["units"]}
    evaluation = paths["evaluate.crf"] / "evaluation"
    assert {
        "per_type.csv",
        "type_confusion.csv",
        "worst_sentences.csv",
        "worst_sentences.html",
        "metrics.json",
    } <= {p.name for p in evaluation.iterdir()}
    per_type = pd.read_csv(evaluation / "per_type.csv")
    assert {"NAME", "ORG", "TITLE", "EDU"} <= set(per_type["type"])
    assert "<mark" in (paths["profile"] / "report.html").read_text(encoding="utf-8")


def test_a_second_run_is_all_hits(ner_run):
    out = pipeline_flow("ner-smoke", storage=str(ner_run["store"]))
    assert set(cache_of(out).values()) == {"hit"}


def test_the_registered_tagger_takes_raw_text_and_gives_offsets_into_it(ner_run):
    import mlflow

    model = mlflow.pyfunc.load_model("models:/zhpipe-ner-smoke@champion")
    texts = [
        "张伟，男，１９６５年出生，北京大学硕士，现任中国银行行长。",
        "\u200b王芳，研究生学历。",
        None,
        "",
    ]
    out = model.predict(texts)
    assert list(out.columns) == ["entities", "count", "status"]
    assert out["status"].tolist() == ["ok", "ok", "missing", "empty"]
    for text, cell in zip(texts, out["entities"]):
        for e in json.loads(cell):
            assert text[e["start"] : e["end"]] == e["text"] and 0 < e["score"] <= 1
    first = {(e["text"], e["type"]) for e in json.loads(out["entities"][0])}
    assert ("张伟", "NAME") in first


def test_predict_command_prints_entities_as_jsonl(ner_run, capsys):
    from flows.cli import main

    # the store whose record vouches for the tagger's files (flows.track.trust)
    assert (
        main(
            [
                "predict",
                "--pipeline",
                "ner-smoke",
                "--storage",
                str(ner_run["store"]),
                "--jsonl",
                "李明，高级经济师。",
            ]
        )
        == 0
    )
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    record = json.loads(line)
    assert record["text"] == "李明，高级经济师。" and record["status"] == "ok"
    assert all(record["text"][e["start"] : e["end"]] == e["text"] for e in record["entities"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["augment.method=eda"], "would shift entity tags"),
        (
            ["train.models=[crf,textcnn]"],
            "textcnn is a classification model; task ner takes crf, bilstm_crf, lexicon_tagger, "
            "ner_ensemble",
        ),
        (
            ["train.models=[crf,ner_ensemble]"],
            "train.ner_ensemble.members: bilstm_crf, lexicon_tagger not in train.models",
        ),
    ],
)
def test_task_rules_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_pipeline("ner-smoke", overrides=overrides)


def test_a_classification_pipeline_refuses_taggers_and_given_splits():
    with pytest.raises(ConfigError, match="crf is a ner model"):
        load_pipeline("smoke", overrides=["train.models=[crf]"])
    with pytest.raises(ConfigError, match="source.splits"):
        load_pipeline("smoke", overrides=["source.splits={test: {path: x.csv}}"])


def test_an_ensemble_of_one_tagger_follows_that_tagger(ner_run, tmp_path):
    """Averaging one member's marginals and decoding them within the tag scheme gives the member's
    spans (Viterbi and the best path over marginals part only where the model is unsure)."""
    import shutil

    from tasks.ner.evaluate import entity_scores
    from tasks.ner.models import load_tagger

    paths = {u["stage"]: Path(u["path"]) for u in ner_run["out"]["units"]}
    folder = tmp_path / "one"
    shutil.copytree(paths["train.crf"] / "crf", folder / "members" / "crf")
    labels = json.loads((folder / "members" / "crf" / "config.json").read_text(encoding="utf-8"))[
        "labels"
    ]
    (folder / "config.json").write_text(
        json.dumps({"kind": "ensemble", "members": ["crf"], "weights": None, "labels": labels})
    )
    texts = [
        s.text
        for s in parse_conll(
            (FIXTURES / "test.bmes").read_text(encoding="utf-8").splitlines()
        ).sentences
    ]
    member, ensemble = load_tagger(folder / "members" / "crf")(texts), load_tagger(folder)(texts)
    assert all(len(e.tags) == len(t) for e, t in zip(ensemble, texts))
    agreement, _ = entity_scores([m.tags for m in member], [e.tags for e in ensemble], labels)
    assert agreement["test_f1"] > 0.9


def test_ner_defaults_fill_in_when_a_pipeline_names_no_models(tmp_path):
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(
        f"pipelines:\n  n:\n    task: ner\n    source: {{path: {FIXTURES / 'train.bmes'}}}\n",
        encoding="utf-8",
    )
    config = load_pipeline("n", config_file)
    assert (
        config.stages.train.models == ["crf", "bilstm_crf", "lexicon_tagger", "ner_ensemble"]
        and config.stages.augment.method == "none"
    )


def _tiny_bert(folder: Path) -> Path:
    """A random 1-layer BERT and a character tokenizer covering the fixture's characters (no
    hub)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    chars = sorted(
        {
            c
            for name in ("train", "dev", "test")
            for c in (FIXTURES / f"{name}.bmes").read_text(encoding="utf-8").split()
            if len(c) == 1
        }
    )
    folder.mkdir()
    tokenizer = BertTokenizerFast(
        vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars])}
    )
    assert tokenizer.unk_token_id not in tokenizer("张伟")["input_ids"]
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_tagger_on_a_pretrained_bert_checkpoint(ner_run, tmp_path):
    """encoder bert: a checkpoint folder (here a tiny random BERT) as the character encoder,
    trained, logged and served like the others."""
    import mlflow

    folder = _tiny_bert(tmp_path / "tiny-bert")
    overrides = [
        "train.models=[lexicon_tagger]",
        "train.lexicon_tagger.encoder=bert",
        f"train.lexicon_tagger.checkpoint={folder}",
        "train.lexicon_tagger.epochs=2",
        "train.lexicon_tagger.encoder_lr=0.001",
    ]
    out = pipeline_flow(
        "ner-smoke",
        overrides=overrides,
        storage=str(ner_run["store"]),
        stages=["train", "evaluate"],
    )
    unit = next(u for u in out["units"] if u["stage"] == "train.lexicon_tagger")
    assert unit["cache"] == "miss" and unit["facts"]["summary"]["parameters"] > 20_000
    history = unit["facts"]["summary"]["history"]
    assert len(history) == 2 and history[-1]["train_loss"] < history[0]["train_loss"]
    run = client().get_run(unit["run_id"])
    served = mlflow.pyfunc.load_model(run.data.tags["zhpipe.model_uri"])
    (cell,) = served.predict(["张伟，研究生学历。"])["entities"]
    assert isinstance(json.loads(cell), list)


def test_a_missing_checkpoint_is_one_clear_error(monkeypatch):
    import huggingface_hub.constants

    from tasks.ner.models import _bert
    from tasks.util.hub import ModelMissingError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ModelMissingError,
        match=r"BERT checkpoint 'no-such/bert' not found locally.*huggingface-cli download "
        r"no-such/bert",
    ):
        _bert({}, "no-such/bert")
    with pytest.raises(ConfigError, match="encoder bert needs a checkpoint"):
        load_pipeline("ner-smoke", overrides=["train.bilstm_crf.encoder=bert"])


def test_a_seed_ensemble_trains_its_copies_and_tags_with_their_average(ner_run):
    import torch

    from tasks.ner.models import load_tagger
    from tasks.ner.tagging import spans_from

    overrides = [
        "train.models=[bilstm_crf]",
        "train.bilstm_crf.seeds=2",
        "train.bilstm_crf.epochs=1",
    ]  # copies, not accuracy
    out = pipeline_flow(
        "ner-smoke", overrides=overrides, storage=str(ner_run["store"]), stages=["train"]
    )
    unit = next(u for u in out["units"] if u["stage"] == "train.bilstm_crf")
    assert len(unit["facts"]["summary"]["copies_val_f1_best"]) == 2
    folder = Path(unit["path"]) / "bilstm_crf"
    saved = torch.load(folder / "model.pt", weights_only=True)
    first, second = saved["state_dicts"]
    assert not torch.equal(first["emit.weight"], second["emit.weight"])  # two seeds, two models
    texts = [
        s.text
        for s in parse_conll(
            (FIXTURES / "test.bmes").read_text(encoding="utf-8").splitlines()
        ).sentences
    ]
    for text, tagged in zip(texts, load_tagger(folder)(texts)):
        # well formed
        assert len(tagged.tags) == len(text) and spans_from(tagged.tags, "bioes")[1] is None
        assert np.allclose(tagged.marginals.sum(1), 1.0, atol=1e-4)
