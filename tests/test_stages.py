"""The stage graph and the task kinds are declared once (tasks/stages.py): a new stage is one module
and one entry, a new task kind is one declaration, and everything in flows/ (config schema, key
plan, Prefect wiring, run summary, `api.load`) follows from them."""

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tasks import stages as graph

ROOT = Path(__file__).resolve().parent.parent

TOY_STAGE = '''
"""Stage `lengths`: the character-length histogram of the train split."""
import json

import pandas as pd

from tasks.core import BuildContext, BuildOutput, Section

LIBRARIES = ("pandas",)
FILES = ()


class Params(Section):
    bins: int = 4


def build(ctx: BuildContext) -> BuildOutput:
    train = pd.read_parquet(ctx.inputs["split"] / "train.parquet")
    lengths = train["text"].str.len()
    counts = pd.cut(lengths, ctx.params.bins).value_counts(sort=False).tolist()
    (ctx.out / "lengths.json").write_text(json.dumps({"bins": ctx.params.bins, "counts": counts}))
    return BuildOutput(rows=len(train), metrics={"mean_chars": float(lengths.mean())})
'''


def toy_module(folder: Path, name: str, source: str, monkeypatch):
    """A stage module written to `folder` and importable as `name` for the test (as a user's own
    module would be)."""
    (folder / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy_kind(tmp_path, monkeypatch):
    """A toy stage (one module) and a toy task kind (one entry of KINDS) that reads, cleans, splits
    and measures lengths."""
    lengths = toy_module(tmp_path, "toy_lengths", TOY_STAGE, monkeypatch)
    base = graph.CLASSIFICATION_STAGES
    stage = graph.Stage(
        "lengths",
        ("split",),
        lengths.build,
        "length histogram",
        "mean_chars",
        (graph.Output("lengths.json", "json"),),
        params=lengths.Params,
        libraries=lengths.LIBRARIES,
        files=lengths.FILES,
    )
    kind = graph.TaskKind(
        "lengths",
        "corpus lengths",
        graph.graph(base["download"], base["clean"], base["split"], stage),
        metric=lambda config: "none",
        reported=(),
        flavour="classifier",
    )
    monkeypatch.setitem(graph.KINDS, "lengths", kind)
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(
        f"""
pipelines:
  toy:
    task: lengths
    source: {{path: {ROOT / "tests/fixtures/smoke.csv"}, text_column: review, label_column: label}}
    stages:
      lengths: {{bins: 3}}
""",
        encoding="utf-8",
    )
    return {"kind": kind, "config_file": config_file, "store": tmp_path / "store"}


TOY_SERVING = '''
"""Serving of the toy kind: its "model" is a length rule (rule.txt: a number of characters); a
text longer than that is labelled 1. tasks/serving.py says what each name is."""
from pathlib import Path

import pandas as pd

from tasks.util.paired import Outcomes, length_buckets
from tasks.serving import Shown, checked

LEGACY = ""


def settings(config, labels):
    return {"labels": labels}


def example(model):
    return ["好", "房间很干净，服务也好，早餐丰富，下次还会再来"]


class Served:
    def __init__(self, config, model):
        self.longer_than, self.max_rows = int((Path(model) / "rule.txt").read_text()), 1000

    def __call__(self, values):
        values = checked(values, self.max_rows)
        guess = ["1" if len(v or "") > self.longer_than else "0" for v in values]
        return pd.DataFrame({"guess": guess,
                             "status": ["missing" if v is None else "ok" for v in values]})


def outcomes(served, ask, test, metric):
    texts = test["text"].astype(str).tolist()
    truth = test["label"].astype(str).to_numpy()
    predicted = ask(texts)["guess"].astype(str).to_numpy()
    return Outcomes("labels", metric, {"truth": truth, "predicted": predicted},
                    {"length": length_buckets(texts)})


SHOWN = Shown("guess", ("guess",), found=lambda out: f"guesses: {len(out)}")
'''


@pytest.mark.e2e
def test_a_toy_kind_serves_and_is_champion_scored_through_the_registry(
    toy_kind, tmp_path, monkeypatch
):
    """A kind's serving is its own module (here the toy kind's, written to its own folder) plus its
    declaration's `serving`: its models are logged through the one generic pyfunc, answer as the
    kind says, and the champion rule scores them as served, on the same rows, by the kind's
    outcomes: a better rule replaces the champion."""
    import mlflow
    import pandas as pd

    from flows.plan.config import load_pipeline
    from flows.track.champion import register_best
    from flows.track.serving import log_model, served_outcomes
    from flows.track.tracker import Tracker

    toy = toy_module(tmp_path, "toy_serving", TOY_SERVING, monkeypatch)
    monkeypatch.setitem(graph.KINDS, "lengths", dataclasses.replace(toy_kind["kind"], serving=toy))
    config = load_pipeline("toy", toy_kind["config_file"])
    texts = ["好" * n for n in range(1, 201)]
    test = pd.DataFrame(
        {"id": range(200), "text": texts, "label": ["1" if len(t) > 20 else "0" for t in texts]}
    )
    run, uris = Tracker.start("zhpipe-toy-kind", "toy"), {}
    for rule in (80, 20):  # the champion gets 140 of 200 rows right, the challenger all of them
        folder = tmp_path / f"rule-{rule}"
        folder.mkdir()
        (folder / "rule.txt").write_text(str(rule))
        uris[rule] = log_model(run.run_id, f"rule{rule}", folder, ["0", "1"], config).model_uri
    run.finish()
    answers = mlflow.pyfunc.load_model(uris[20]).predict(["好", "好" * 30, None])
    assert answers["guess"].tolist() == ["0", "1", "0"] and answers["status"].tolist() == [
        "ok",
        "ok",
        "missing",
    ]
    served = lambda model_uri, frame: served_outcomes(model_uri, frame, "accuracy")
    first = register_best(
        uris[80],
        run.run_id,
        "toy-kind",
        "rule80",
        test,
        "accuracy",
        0.70,
        model_key="r80",
        rescore=served,
    )
    assert first.champion
    better = register_best(
        uris[20],
        run.run_id,
        "toy-kind",
        "rule20",
        test,
        "accuracy",
        1.0,
        model_key="r20",
        rescore=served,
    )
    assert better.champion and better.champion_score == pytest.approx(0.70), better.reason
    assert (
        "on the same 200 rows (both as served)" in better.reason
        and "paired bootstrap" in better.reason
    )


def test_the_graph_is_declared_in_order_and_names_are_written_once():
    assert graph.STAGE_NAMES == tuple(graph.CLASSIFICATION_STAGES)
    for kind in graph.KINDS.values():
        seen = set()
        for stage in kind.stages.values():
            assert set(stage.needs) <= seen, (kind.name, stage.name)
            seen.add(stage.name)
    with pytest.raises(ValueError, match="needs 'nowhere', which is not declared before it"):
        graph.graph(
            graph.Stage(
                "x",
                ("nowhere",),
                graph.CLASSIFICATION_STAGES["clean"].build,
                "",
                "",
                params=graph.CLASSIFICATION_STAGES["clean"].params,
            )
        )
    # the stage names appear as a literal list nowhere else in the source tree
    literal = re.compile(r'"download",\s*"clean",\s*"split"')
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in ("flows", "tasks")
        for p in (ROOT / pkg).rglob("*.py")
        if literal.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_flows_hold_no_branch_on_a_task_kind():
    """Every difference between kinds is in their declarations: no `task == "ner"` in flows/."""
    pattern = re.compile(r"""task\s*[!=]=\s*["']|["'](ner|classification)["']\s*[!=]=""")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "flows").rglob("*.py")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_a_kinds_settings_are_its_own(tmp_path):
    """A classification pipeline has no lexicon or given-splits settings, a ner pipeline no
    classifiers."""
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown key 'stages.vocab.lexicon'"):
        load_pipeline("smoke", ROOT / "pipelines.yaml", ["vocab.lexicon.min_freq=3"])
    with pytest.raises(ConfigError, match="unknown key 'stages.split.use_given'"):
        load_pipeline("smoke", ROOT / "pipelines.yaml", ["split.use_given=false"])
    assert (
        load_pipeline(
            "ner-smoke", ROOT / "pipelines.yaml", ["vocab.lexicon.min_freq=3"]
        ).stages.vocab.lexicon.min_freq
        == 3
    )
    with pytest.raises(ConfigError, match="unknown key 'stages.train.textcnn'"):
        load_pipeline("ner-smoke", ROOT / "pipelines.yaml", ["train.textcnn.lr=0.1"])
    with pytest.raises(ConfigError, match="unknown task kind 'nope'"):
        (tmp_path / "p.yaml").write_text(
            "pipelines:\n  x:\n    task: nope\n    source: {path: a.csv}\n"
        )
        load_pipeline("x", tmp_path / "p.yaml")


@pytest.mark.e2e
def test_a_toy_stage_and_kind_run_through_the_real_flow(toy_kind, prefect_harness, monkeypatch):
    """One module and one entry: the config takes the toy kind's sections, the plan keys the toy
    stage, the Prefect flow builds it in graph order, the summary shows its headline and `api.load`
    reads its output."""
    from flows import api
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.plan import project
    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys

    config = load_pipeline("toy", toy_kind["config_file"])
    assert config.kind is toy_kind["kind"] and config.stages.lengths.bins == 3
    keys = plan_keys(config)
    assert list(keys) == ["download", "clean", "split", "lengths"]
    assert (
        plan_keys(load_pipeline("toy", toy_kind["config_file"], ["lengths.bins=5"]))["split"]
        == keys["split"]
    )
    out = pipeline_flow(
        "toy", config_file=str(toy_kind["config_file"]), storage=str(toy_kind["store"])
    )
    summary = {s["stage"]: s for s in out["stages"]}
    assert list(summary) == ["download", "clean", "split", "lengths"]
    assert (
        summary["lengths"]["headline"] == "mean_chars"
        and summary["lengths"]["metrics"]["mean_chars"] > 0
    )
    folder = toy_kind["store"] / "lengths" / keys["lengths"]
    doc = json.loads((folder / "lengths.json").read_text())
    assert doc["bins"] == 3 and sum(doc["counts"]) == summary["lengths"]["rows"]
    # api.load(project=...) activates the toy project
    monkeypatch.setattr(project, "_CURRENT", project._CURRENT)
    loaded = api.load(
        "toy", "lengths", project=toy_kind["config_file"].parent, storage=str(toy_kind["store"])
    )
    assert loaded == doc
    again = pipeline_flow(
        "toy", config_file=str(toy_kind["config_file"]), storage=str(toy_kind["store"])
    )
    assert {s["stage"]: s["cache"] for s in again["stages"]} == dict.fromkeys(summary, "hit")


def test_every_stage_declares_what_api_load_reads():
    for kind in graph.KINDS.values():
        for stage in kind.stages.values():
            assert stage.outputs, (kind.name, stage.name)
            assert all(
                dataclasses.is_dataclass(o)
                and o.kind in {"frame", "splits", "json", "csv", "vocabulary", "vectors", "text"}
                for o in stage.outputs
            )


TOY_MODEL_STAGE = '''
"""Stage `calibrate`: each trained model's expected calibration error on the validation split."""
import json

import numpy as np
import pandas as pd

from tasks.core import BuildContext, BuildOutput, Section, by_model
from tasks.stages import MODELS

LIBRARIES = ("numpy",)
FILES = ()


class Params(Section):
    bins: int = 5


def build_model(ctx: BuildContext, name: str) -> BuildOutput:
    labels = ctx.facts["train"].labels
    validation = pd.read_parquet(ctx.file("segment", "validation.parquet"))
    probs = MODELS[name].load(ctx.inputs["train"] / name)(validation)
    truth = validation["label"].astype(str).map(labels.index).to_numpy()
    confidence, right = probs.max(1), probs.argmax(1) == truth
    edges = np.linspace(0, 1, ctx.params.bins + 1)[1:-1]
    bins = np.digitize(confidence, edges)
    ece = sum(abs(right[bins == b].mean() - confidence[bins == b].mean()) * (bins == b).mean()
              for b in range(ctx.params.bins) if (bins == b).any())
    (ctx.out / "calibration.json").write_text(json.dumps({"model": name, "ece": float(ece)}))
    return BuildOutput(rows=len(validation), metrics={"val_ece": float(ece)},
                       facts=ctx.facts["train"])


def build(ctx: BuildContext) -> BuildOutput:
    ece = {model: json.loads((folder / "calibration.json").read_text())["ece"]
           for model, folder in by_model(ctx.inputs).items()}
    (ctx.out / "calibration.json").write_text(json.dumps(ece))
    return BuildOutput(metrics={f"{m}_val_ece": v for m, v in ece.items()})
'''


@pytest.mark.e2e
def test_a_per_model_stage_is_one_module_and_one_entry(tmp_path, smoke, monkeypatch):
    """A per-model stage added to a toy kind (classification's stages and `calibrate`): a unit per
    model keyed on that model's training alone, built through the real Prefect flow, each unit's
    metrics in its model's MLflow run, gathered by the stage, reused on the next run."""
    from flows.orchestrate.pipeline import pipeline_flow
    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan_keys
    from flows.track.tracker import client

    module = toy_module(tmp_path, "toy_calibrate", TOY_MODEL_STAGE, monkeypatch)
    base = graph.CLASSIFICATION_STAGES
    calibrate = graph.Stage(
        "calibrate",
        ("train", "segment"),
        module.build,
        "calibration error per model",
        "tfidf_lr_val_ece",
        (graph.Output("calibration.json", "json"),),
        models=graph.PerModel(reads=("train",)),
        build_model=module.build_model,
        params=module.Params,
        libraries=module.LIBRARIES,
        files=module.FILES,
    )
    kind = graph.TaskKind(
        "calibrated",
        "classifiers and their calibration",
        graph.graph(*base.values(), calibrate),
        metric=lambda config: config.stages.evaluate.metric,
        reported=("test_accuracy",),
        flavour="classifier",
        models_of="classification",
    )
    monkeypatch.setitem(graph.KINDS, "calibrated", kind)
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(
        """
pipelines:
  toy:
    task: calibrated
    source: {path: tests/fixtures/smoke.csv, format: csv, text_column: review, label_column: label}
    stages:
      embed:
        word2vec: {vector_size: 32, epochs: 2}
        fasttext: {dim: 30, epoch: 1, bucket: 50000}
      train: {models: [tfidf_lr, fasttext], fasttext: {epoch: 5, lr: 0.1, dim: 30, bucket: 50000}}
      calibrate: {bins: 4}
""",
        encoding="utf-8",
    )
    keys = plan_keys(load_pipeline("toy", config_file))
    assert [u for u in keys if u.startswith("calibrate")] == [
        "calibrate.tfidf_lr",
        "calibrate.fasttext",
        "calibrate",
    ]
    retrained = plan_keys(load_pipeline("toy", config_file, ["train.fasttext.epoch=6"]))
    assert (
        retrained["calibrate.tfidf_lr"] == keys["calibrate.tfidf_lr"]
        and retrained["calibrate.fasttext"] != keys["calibrate.fasttext"]
    )
    # into the session store: the smoke run's data stages are reused
    out = pipeline_flow("toy", config_file=str(config_file))
    summary = {s["stage"]: s for s in out["stages"]}
    assert (
        summary["calibrate"]["cache"] == "miss"
        and summary["calibrate"]["headline"] == "tfidf_lr_val_ece"
    )
    units = {u["stage"]: u for u in out["units"]}
    assert {"calibrate.tfidf_lr", "calibrate.fasttext"} <= set(units)
    eces = {m: summary["calibrate"]["metrics"][f"{m}_val_ece"] for m in ("tfidf_lr", "fasttext")}
    assert all(0 <= v <= 1 for v in eces.values())
    for model in eces:  # each unit logged into its model's run, beside its training
        runs = client().search_runs(
            [client().get_run(out["parent_run_id"]).info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{out['parent_run_id']}' and "
            f"tags.`zhpipe.model` = '{model}'",
        )
        assert len(runs) == 1 and runs[0].data.metrics["val_ece"] == pytest.approx(eces[model])
        assert {"seconds", "evaluate_seconds", "calibrate_seconds"} <= set(runs[0].data.metrics)
    again = pipeline_flow("toy", config_file=str(config_file), stages=["calibrate"])
    assert [(s["stage"], s["cache"]) for s in again["stages"]] == [("calibrate", "hit")]


def test_every_stage_holds_its_functions_from_its_kinds_package():
    """A stage holds its code: build (and part_build, gather, build_model where it has them) are
    function objects of one module in its kind's package (segment, which every kind shares, in
    tasks/shared), a reader and a tool can follow from the declaration into the code; a wrong entry
    fails when the kind is declared."""
    import types

    from tasks.classification import clean, vocab

    for kind in graph.KINDS.values():
        for stage in kind.stages.values():
            functions = [
                f
                for f in (stage.build, stage.part_build, stage.gather, stage.build_model)
                if f is not None
            ]
            assert all(isinstance(f, types.FunctionType) for f in functions), (
                kind.name,
                stage.name,
            )
            package = "tasks.shared" if stage.name == "segment" else f"tasks.{kind.name}"
            module = sys.modules[stage.module_name]
            assert {f.__module__ for f in functions} == {stage.module_name}, (kind.name, stage.name)
            assert stage.module_name.startswith(f"{package}."), (kind.name, stage.name)
            # declared whole: its section, libraries and files are the entry's, the same as its
            # module's own
            section = module.params() if stage.name == "train" else module.Params
            assert stage.section().model_fields.keys() == section.model_fields.keys(), (
                kind.name,
                stage.name,
            )
            assert (stage.libraries, stage.files) == (module.LIBRARIES, module.FILES), (
                kind.name,
                stage.name,
            )
    assert graph.CLASSIFICATION_STAGES["vocab"].part_build is vocab.count
    with pytest.raises(
        TypeError,
        match="stage 'x': build, part_build, gather and build_model must be functions of one",
    ):
        graph.Stage("x", (), clean.build, "", "", part_build=vocab.count)
    with pytest.raises(TypeError, match="stage 'x': params= must be its config section"):
        graph.Stage("x", (), clean.build, "", "")
    with pytest.raises(TypeError, match="stage 'x': libraries= and files= must be tuples of names"):
        graph.Stage("x", (), clean.build, "", "", params=clean.Params, libraries="pandas")
    with pytest.raises(TypeError, match="build_model exactly when it has a unit per model"):
        graph.Stage("x", (), clean.build, "", "", params=clean.Params, models=graph.PerModel())
    with pytest.raises(TypeError, match="content= names files of the stages it needs only"):
        graph.Stage("x", (), clean.build, "", "", params=clean.Params, content=(("y", "a.txt"),))
    with pytest.raises(TypeError, match="content= columns are a tuple of column names"):
        graph.Stage(
            "x", ("y",), clean.build, "", "", params=clean.Params, content=(("y", "a", "words"),)
        )


def test_a_stage_built_beside_the_others_is_one_unit_nothing_needs():
    """`beside`: a run builds the stage in a process of its own while the stages after it go on,
    so no stage may need it, and it is one unit (no partitions, no models) that the data checks
    do not judge."""
    from tasks.classification import clean, profile

    kinds = graph.KINDS.values()
    assert [s.name for k in kinds for s in k.stages.values() if s.beside] == ["profile"] * 3
    for flag in ({"partitioned": True}, {"checked": True}):
        with pytest.raises(TypeError, match="built beside the others is one unit and unchecked"):
            graph.Stage("x", (), clean.build, "", "", beside=True, params=clean.Params, **flag)
    kind = graph.KINDS["classification"]
    after = graph.Stage("after", ("profile",), profile.build, "", "", params=profile.Params)
    needed = "stage 'profile' is built beside the others, yet another stage needs it"
    with pytest.raises(TypeError, match=needed):
        dataclasses.replace(kind, stages=dict(kind.stages) | {"after": after})
