"""Registry, pyfunc, serving and the run commands, on models trained here by the smoke pipeline: the
pyfunc takes raw text and predicts like the training code, `mlflow models serve` answers on
loopback, the champion rule holds, and `zhpipe predict/runs/compare` work from the command line."""

import os
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow
from flows.plan.config import load_pipeline
from flows.plan.store import StageStore
from flows.track.tracker import client
from tasks.errors import ZhpipeError
from tests.helpers.cli import in_process
from tests.helpers.procs import zhpipe
from tests.helpers.runs import without_profile
from tests.helpers.serving import mlflow_serving

ROOT = Path(__file__).resolve().parents[3]
SETS = ["train.models=[tfidf_lr, textcnn]"]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def trained(prefect_harness, tmp_path_factory, seed_mlflow):
    """Two runs into a store and a registry of their own: a model key this module trains may have
    been registered from another store by a module that ran before it in this test process, and a
    version is loaded only from the store whose run logged it."""
    store = tmp_path_factory.mktemp("registry-store")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", seed_mlflow(store.parent / f"{store.name}-mlflow.db"))
        yield _trained(store)


def _trained(store: Path) -> dict:
    # the registry reads no pictures
    first = pipeline_flow("smoke", overrides=SETS, storage=str(store), stages=without_profile())
    second = pipeline_flow(
        "smoke", overrides=SETS + ["train.epochs=2"], storage=str(store), stages=without_profile()
    )
    stages = {r["stage"]: r for r in first["stages"]}
    units = {u["stage"]: u for u in first["units"]}
    tfidf_run = units["train.tfidf_lr"]["run_id"]
    return {
        "store": store,
        "first": first,
        "second": second,
        "tfidf_run": tfidf_run,
        "models": {n: Path(units[f"train.{n}"]["path"]) / n for n in ("tfidf_lr", "textcnn")},
        "segment": Path(stages["segment"]["path"]),
        "labels": stages["train"]["facts"]["labels"],
        "tags": client().get_run(first["parent_run_id"]).data.tags,
    }


def test_pyfunc_takes_raw_text_and_predicts_like_the_training_code(trained):
    import mlflow

    from flows.track.serving import log_model
    from flows.track.tracker import Tracker
    from tasks.stages import MODELS

    test = pd.read_parquet(trained["segment"] / "test.parquet")
    config = load_pipeline("smoke", overrides=SETS)
    run = Tracker.start("zhpipe-pyfunc-test", "pyfunc")
    for name in ("tfidf_lr", "textcnn"):
        info = log_model(run.run_id, name, trained["models"][name], trained["labels"], config)
        got = mlflow.pyfunc.load_model(info.model_uri).predict(test["text"].tolist())
        want = MODELS[name].load(trained["models"][name])(test)
        np.testing.assert_allclose(
            got[[f"p_{label}" for label in trained["labels"]]].to_numpy(),
            want,
            rtol=1e-5,
            atol=1e-6,
        )
        assert got["label"].tolist() == [trained["labels"][i] for i in want.argmax(1)]
    run.finish()


def test_best_model_is_registered_and_champion_on_first_registration(trained):
    tags = trained["tags"]
    name, version = tags["zhpipe.registered"].split("/")
    assert name == "zhpipe-smoke"
    mv = client().get_model_version(name, version)
    assert (
        mv.tags["zhpipe.model"] == tags["zhpipe.best_model"]
        and len(mv.tags["zhpipe.test_sha256"]) == 64
    )
    assert tags["zhpipe.champion_reason"]


def test_champion_rule(trained):
    """better -> champion; worse -> registered without the alias; another test split -> never
    compared."""
    from flows.track.champion import register_best

    test = pd.read_parquet(trained["segment"] / "test.parquet")
    run_id = trained["first"]["parent_run_id"]

    uri = client().get_run(trained["tfidf_run"]).data.tags["zhpipe.model_uri"]

    def register(score, frame=test, key=None):
        return register_best(
            uri,
            run_id,
            "rule-test",
            "tfidf_lr",
            frame,
            "accuracy",
            score,
            model_key=key or f"key-{score}-{len(frame)}",
        )

    def champion():
        return str(client().get_model_version_by_alias("zhpipe-rule-test", "champion").version)

    first = register(0.80)
    assert first.champion and champion() == first.version
    worse = register(0.70)
    assert not worse.champion and champion() == first.version and "does not beat" in worse.reason
    better = register(0.90)
    assert better.champion and champion() == better.version and "beats" in better.reason
    other = register(0.99, test.iloc[:-1])
    assert (
        not other.champion and champion() == better.version and "another test split" in other.reason
    )
    again = register(0.90)  # the same model key: no new version, and it stays champion
    assert (
        again.version == better.version
        and "already registered" in again.reason
        and champion() == better.version
    )
    # `zhpipe runs` says "already" for it
    assert again.holds and not again.champion and better.holds and not worse.holds


def test_the_champion_is_replaced_only_beyond_the_noise_of_the_same_test_rows(trained):
    """Each registration scores the new version and the champion as they are served, on the same
    (today's) test rows, and compares them by a paired bootstrap: a copy of the champion, whatever
    score its run claims, never moves the alias; a model that is better beyond the noise does; a
    version that cannot be scored keeps it."""
    from flows.track.champion import register_best
    from flows.track.serving import score_served, served_outcomes

    test = pd.read_parquet(trained["segment"] / "test.parquet")
    uri = client().get_run(trained["tfidf_run"]).data.tags["zhpipe.model_uri"]
    run_id = trained["first"]["parent_run_id"]
    # where the run that logged the model recorded its files' digest
    store = StageStore(trained["store"])
    served = lambda model_uri, frame: served_outcomes(model_uri, frame, "accuracy", store=store)

    def register(score, frame, key, rescore=served, model_uri=uri):
        return register_best(
            model_uri,
            run_id,
            "rescore-test",
            "tfidf_lr",
            frame,
            "accuracy",
            score,
            model_key=key,
            rescore=rescore,
        )

    first = register(0.5, test, "k1")
    assert first.champion
    today = test.iloc[: len(test) - 3]
    truth = score_served(
        f"models:/zhpipe-rescore-test/{first.version}", today, "accuracy", store=store
    )
    assert 0.5 < truth <= 1.0  # a real model, really scored
    # the same model, claiming a better score on a grown corpus
    claims = register(0.99, today, "k2")
    assert not claims.champion and claims.champion_score == pytest.approx(truth, abs=1e-6)
    assert (
        f"on the same {len(today)} rows (both as served)" in claims.reason
        and "inside the noise" in claims.reason
    )
    assert "paired bootstrap" in claims.reason and claims.test_sha256 != first.test_sha256
    tags = client().get_model_version("zhpipe-rescore-test", claims.version).tags
    assert float(tags["zhpipe.champion_score"]) == pytest.approx(truth, abs=1e-6)
    scored = []

    def counted(model_uri, frame):
        scored.append(model_uri)
        return served(model_uri, frame)

    # the same two versions on the same rows: decided before
    again = register(0.99, today, "k2", rescore=counted)
    assert again.version == claims.version and not again.champion and scored == []
    assert (
        again.reason == f"already registered as version {claims.version} (key k2); " + claims.reason
    )

    def broken(model_uri, frame):
        raise OSError("artifact store unreachable")

    kept = str(client().get_model_version_by_alias("zhpipe-rescore-test", "champion").version)
    odd = register(0.99, test.iloc[:-1], "k4", rescore=broken)
    assert (
        not odd.champion
        and "could not be scored on today's test split" in odd.reason
        and "OSError" in odd.reason
    )
    assert (
        str(client().get_model_version_by_alias("zhpipe-rescore-test", "champion").version) == kept
    )


def test_a_clearly_better_model_replaces_a_weak_champion(trained, monkeypatch):
    """A champion that labels every text alike (as a one-epoch model might) is replaced by the
    trained model: the interval of the difference is above zero on the same test rows."""
    from flows.track.champion import register_best
    from flows.track.serving import served_outcomes
    from tasks.util.paired import Outcomes

    test = pd.read_parquet(trained["segment"] / "test.parquet")
    uri = client().get_run(trained["tfidf_run"]).data.tags["zhpipe.model_uri"]
    run_id = trained["first"]["parent_run_id"]
    weak_version = []

    def served(model_uri, frame):
        real = served_outcomes(model_uri, frame, "accuracy", store=StageStore(trained["store"]))
        # the weak champion: a label no text has, for every text
        if model_uri.endswith(f"/{weak_version[0]}"):
            return Outcomes(
                "labels",
                "accuracy",
                {
                    "truth": real.columns["truth"],
                    "predicted": np.full(real.rows, "none", dtype=object),
                },
                real.slices,
            )
        return real

    first = register_best(
        uri,
        run_id,
        "weak-test",
        "tfidf_lr",
        test,
        "accuracy",
        0.5,
        model_key="weak",
        rescore=served,
    )
    weak_version.append(first.version)
    assert first.champion
    strong = register_best(
        uri,
        run_id,
        "weak-test",
        "tfidf_lr",
        test,
        "accuracy",
        0.8,
        model_key="strong",
        rescore=served,
    )
    assert strong.champion and "better beyond the noise" in strong.reason, strong.reason
    assert (
        str(client().get_model_version_by_alias("zhpipe-weak-test", "champion").version)
        == strong.version
    )


def test_a_run_killed_before_registering_is_registered_by_the_next_run(
    prefect_harness, tmp_path, monkeypatch
):
    """evaluate published, then the process dies before registering; the rerun (evaluate cached)
    registers."""
    import flows.orchestrate.model_stages
    from flows.plan.keys import plan_keys
    from flows.track.champion import registered_version

    sets = ["train.models=[tfidf_lr]", "split.seed=5"]

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed between evaluate and registration")

    with monkeypatch.context() as m:
        m.setattr(flows.orchestrate.model_stages, "register_best", killed)
        with pytest.raises(BaseException, match="killed between"):
            pipeline_flow(
                "smoke", overrides=sets, storage=str(tmp_path / "store"), stages=without_profile()
            )
    key = plan_keys(load_pipeline("smoke", overrides=sets))["train.tfidf_lr"]
    assert registered_version("zhpipe-smoke", key) is None
    out = pipeline_flow(
        "smoke", overrides=sets, storage=str(tmp_path / "store"), stages=without_profile()
    )
    assert {s["stage"]: s["cache"] for s in out["stages"]}["evaluate"] == "hit"
    version = registered_version("zhpipe-smoke", key)
    assert version is not None and version.tags["zhpipe.model"] == "tfidf_lr"
    assert (
        client().get_run(out["parent_run_id"]).data.tags["zhpipe.registered"]
        == f"zhpipe-smoke/{version.version}"
    )


def test_mlflow_models_serve_answers_raw_chinese_text(trained):
    uri = "models:/" + trained["tags"]["zhpipe.registered"]
    with mlflow_serving(uri, ROOT) as base:
        r = httpx.post(
            f"{base}/invocations",
            json={"inputs": ["房间很干净，服务也好", "早餐太差了，再也不来"]},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        predictions = r.json()["predictions"]
        assert len(predictions) == 2 and {"label", "probability"} <= set(predictions[0])
        assert all(
            p["label"] in trained["labels"] and 0 <= p["probability"] <= 1 and p["status"] == "ok"
            for p in predictions
        )
        # bad requests: a 4xx with a message, never a confident label
        too_many = httpx.post(f"{base}/invocations", json={"inputs": ["好"] * 10_001}, timeout=60)
        assert too_many.status_code == 400 and "at most 10000" in too_many.json()["message"]
        no_text = httpx.post(
            f"{base}/invocations",
            json={"dataframe_split": {"columns": ["review"], "data": [["好"]]}},
            timeout=60,
        )
        assert 400 <= no_text.status_code < 500, no_text.text
        odd = httpx.post(
            f"{base}/invocations", json={"inputs": ["", "房" * 20_000, "房间很干净"]}, timeout=60
        )
        assert odd.status_code == 200, odd.text
        assert [p["status"] for p in odd.json()["predictions"]] == ["empty", "truncated", "ok"]
        assert odd.json()["predictions"][0].get("label") is None


def test_predict_command(trained, tmp_path, capsys):
    """The first call is a process of its own, as a user runs it; the others go through the same
    `main` in this process (each process spends seconds on its imports alone)."""
    uri = "models:/" + trained["tags"]["zhpipe.registered"]
    proc = zhpipe(
        None, "predict", "--model", uri, "--storage", str(trained["store"]), "房间很干净，服务也好"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "房间很干净" in proc.stdout and "probability" in proc.stdout
    # which model answered
    assert f"version {trained['tags']['zhpipe.registered'].split('/')[1]}" in proc.stdout
    # the input's own label column is kept; missing, "NA" and empty texts are not turned into
    # strings or labels
    pd.DataFrame(
        {"content": ["房间很干净", "太差了", "", "NA", None], "label": ["1", "0", "1", "0", "1"]}
    ).to_csv(tmp_path / "in.csv", index=False)
    proc = in_process(
        capsys,
        "predict",
        "--model",
        uri,
        "--storage",
        str(trained["store"]),
        "--input",
        str(tmp_path / "in.csv"),
        "--text-column",
        "content",
        "--output",
        str(tmp_path / "out.parquet"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert len(out) == 5 and {
        "content",
        "label",
        "pred_label",
        "pred_probability",
        "pred_status",
        "pred_model_version",
    } <= set(out.columns)
    assert out["label"].tolist() == ["1", "0", "1", "0", "1"]  # the input's labels, untouched
    # a CSV cannot tell "" from missing
    assert out["pred_status"].tolist() == ["ok", "ok", "empty", "ok", "empty"]
    assert out["pred_label"].isna().tolist() == [False, False, True, False, True]
    assert (
        out["pred_model"].iloc[0] == "zhpipe-smoke"
        and out["pred_model_version"].iloc[0] == trained["tags"]["zhpipe.registered"].split("/")[1]
    )
    ok = out["pred_status"] == "ok"
    np.testing.assert_allclose(
        out.loc[ok, [f"pred_p_{label}" for label in trained["labels"]]].sum(axis=1), 1.0, atol=1e-4
    )
    on_dask = in_process(
        capsys,
        "predict",
        "--model",
        uri,
        "--storage",
        str(trained["store"]),
        "--input",
        str(tmp_path / "in.csv"),
        "--text-column",
        "content",
        "--output",
        str(tmp_path / "dask.jsonl"),
        "--dask",
        "local",
    )
    assert on_dask.returncode == 0, on_dask.stderr[-2000:]
    dask_out = pd.read_json(tmp_path / "dask.jsonl", lines=True, dtype=False)  # labels stay strings
    assert dask_out["pred_label"].tolist()[:2] == out["pred_label"].tolist()[:2]
    np.testing.assert_allclose(
        dask_out["pred_probability"][:2], out["pred_probability"][:2], rtol=1e-5
    )
    missing = in_process(
        capsys,
        "predict",
        "--model",
        uri,
        "--input",
        str(tmp_path / "in.csv"),
        "--output",
        str(tmp_path / "o.csv"),
    )
    # the text column defaults to the pipeline's (the repository's first pipeline reads `review`)
    assert (
        missing.returncode == 2
        and "no text column 'review'" in missing.stderr.strip().splitlines()[-1]
    )
    bad = in_process(capsys, "predict", "--model", "models:/zhpipe-nothing@champion", "你好")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        "zhpipe: error: cannot load model models:/zhpipe-nothing@champion"
    )
    bad = in_process(
        capsys,
        "predict",
        "--model",
        uri,
        "--input",
        str(tmp_path / "in.csv"),
        "--output",
        str(tmp_path / "out.xlsx"),
        "--text-column",
        "content",
    )
    assert bad.returncode == 2 and "unknown file type '.xlsx'" in bad.stderr


def test_runs_read_from_sqlite_match_the_mlflow_client(trained, tmp_path):
    import sqlite3

    from flows.track.runs import _runs_from_sqlite, runs_from_client, runs_table

    db = Path(os.environ["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"))
    for pipeline in ("smoke", None):
        fast, slow = (
            runs_table(_runs_from_sqlite(db, pipeline, 50)),
            runs_table(runs_from_client(pipeline, 50)),
        )
        assert len(fast) >= 2
        pd.testing.assert_frame_equal(fast, slow)
    with pytest.raises(ZhpipeError, match="no runs of pipeline 'nothing'"):
        _runs_from_sqlite(db, "nothing", 5)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE runs (x)").connection.commit()
    assert _runs_from_sqlite(other, None, 5) is None  # not MLflow's tables: the client reads it


def test_runs_and_compare_commands(trained, capsys, monkeypatch):
    # into a pipe, no width: every column (a terminal's width drops some)
    monkeypatch.delenv("COLUMNS", raising=False)
    first, second = trained["first"]["parent_run_id"], trained["second"]["parent_run_id"]
    proc = in_process(capsys, "runs", "smoke", "--limit", "50")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert first[:12] in proc.stdout and second[:12] in proc.stdout
    proc = in_process(capsys, "compare", first[:12], second[:12])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if "train.epochs" in line]
    assert len(lines) == 1 and "1" in lines[0] and "2" in lines[0]
    assert "best_test_accuracy" in proc.stdout
    assert "segment.mode" not in proc.stdout  # equal in both runs: not shown
    # per-model metrics side by side with their delta: textcnn changed (epochs), tfidf_lr was reused
    # as it was
    from flows.track.runs import compare_table

    table = compare_table([first, second]).set_index("what")
    textcnn = table.loc[[w for w in table.index if w.startswith("model textcnn ")]]
    assert len(textcnn) and all(d.startswith(("+", "-")) for d in textcnn["delta"])
    # the same model in both runs: nothing differs
    assert "model tfidf_lr test_accuracy" not in table.index
    assert table.loc["param train.epochs", "delta"] == "+1.0000"
    runs = in_process(capsys, "runs", "smoke", "--limit", "50").stdout
    # the run names and registered versions
    assert " name " in runs and "registered" in runs and "zhpipe-smoke/" in runs


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "gbk", "utf-16"])
def test_predict_input_files_are_read_in_their_encoding(tmp_path, encoding):
    from flows.track.predict import read_input

    path = tmp_path / f"in-{encoding}.csv"
    path.write_bytes("text,id\n房间很干净，服务很好,1\n早餐太差,2\n".encode(encoding))
    df = read_input(path, "text")
    assert df["text"].tolist() == ["房间很干净，服务很好", "早餐太差"]


def test_a_test_split_hashes_the_same_read_in_batches_as_whole(tmp_path, monkeypatch):
    from flows.track.champion import test_sha256
    from tasks.util import io
    from tasks.util.io import Rows

    frame = pd.DataFrame(
        {
            "id": range(100),
            "line": range(2, 102),
            "text": [f"第{i}条" for i in range(100)],
            "label": ["好" if i % 3 else "差" for i in range(100)],
            "words": ["x"] * 100,
        }
    )
    frame.to_parquet(tmp_path / "sorted.parquet", row_group_size=9)
    frame.sample(frac=1.0, random_state=1).to_parquet(
        tmp_path / "shuffled.parquet", row_group_size=9
    )
    monkeypatch.setattr(io, "BATCH_ROWS", 10)
    whole = test_sha256(frame)
    assert (
        test_sha256(Rows(tmp_path / "sorted.parquet"))
        == whole
        == test_sha256(Rows(tmp_path / "shuffled.parquet"))
    )
    # the labels are part of it; other columns are not
    assert test_sha256(frame.assign(label="好")) != whole
    assert test_sha256(frame.assign(words="y")) == whole
