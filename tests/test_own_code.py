"""A team's own code in a pipeline (docs/extending.md): cleaning rules and data checks from a file
in the project folder, trusted, keyed by their code and reported like the built-in ones."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.cli import in_process

ROOT = Path(__file__).resolve().parents[1]

RULES = '''"""The team's rules."""
import unicodedata


def drop_symbol_only(text):
    """Reviews of nothing but emoji, punctuation and spaces say nothing."""
    if all(unicodedata.category(c)[0] in "PSZ" for c in text):
        return None
    return text
'''

CHECKS = """import pandas as pd


def exclaiming(frame: pd.DataFrame) -> float:
    return float(frame["text"].str.contains("!!!", regex=False).mean())
"""


MODELS = '''"""The team's standard model."""
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC


def char_svc(C=1.0):
    features = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), sublinear_tf=True)
    return make_pipeline(features, LinearSVC(C=C))
'''

# the declaration of docs/extending.md, as written
DECLARED = """      clean:
        rules: [my_rules:drop_symbol_only]   # module:function(text) -> str, or None to drop the row
"""
TRAIN = """        models: [tfidf_lr, fasttext, char_svc]
        char_svc:                            # any name that is not a built-in model
          # module:function(**params) -> an unfitted scikit-learn estimator
          estimator: my_models:char_svc
          # text: the cleaned text; words: jieba's words joined by spaces
          input: text
          params: {C: 0.5}
"""
CHECK = """    checks:
      custom:
        exclaiming: {function: "my_checks:exclaiming", threshold: 0.5, blocking: true}
"""


@pytest.fixture
def project(tmp_path, capsys):
    """A fresh `zhpipe init --csv` project of 306 reviews, 6 of them only symbols, with the team's
    model, rule and check in files beside pipelines.yaml, declared as docs/extending.md declares
    them."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    symbols = pd.DataFrame(
        {
            "review": ["??????????", "！！！。。。", "😀😀😀😀", "……", "~~~~ ~~~~", "？？？"],
            "label": ["1", "0", "1", "0", "1", "0"],
        }
    )
    corpus = tmp_path / "reviews.csv"
    pd.concat([rows, symbols], ignore_index=True).to_csv(corpus, index=False)
    folder = tmp_path / "p"
    done = in_process(capsys, "init", folder, "--csv", corpus, "--text-column", "review")
    assert done.returncode == 0, done.stderr
    for name, text in (("my_rules.py", RULES), ("my_checks.py", CHECKS), ("my_models.py", MODELS)):
        (folder / name).write_text(text, encoding="utf-8")
    config = folder / "pipelines.yaml"
    yaml = config.read_text(encoding="utf-8").replace(
        "    stages:\n", "    stages:\n" + DECLARED, 1
    )
    yaml = yaml.replace("        models: [tfidf_lr, fasttext, textcnn]\n", TRAIN, 1)
    assert "char_svc" in yaml
    config.write_text(yaml + CHECK, encoding="utf-8")
    return folder


def run(capsys, project: Path, *args):
    return in_process(capsys, "--project", project, *args)


def newest(project: Path, unit: str) -> Path:
    """The newest output of `unit` in the project's stage store (ZHPIPE_DATA in the suite, else its
    data/)."""
    root = Path(os.environ.get("ZHPIPE_DATA") or project / "data")
    return max(
        (p for p in (root / unit).iterdir() if (p / "manifest.json").exists()),
        key=lambda p: p.stat().st_mtime,
    )


@pytest.mark.e2e
def test_the_teams_model_rule_and_check_run_as_declared_and_its_champion_serves(
    project, capsys, tmp_path, monkeypatch
):
    """The declaration of docs/extending.md on a fresh project: the rule quarantines the six
    symbol-only rows by its name, the check is judged, the LinearSVC over character 1-3 grams is
    trained, tracked and compared beside the built-in models; a real edit of my_models.py rebuilds
    its units only (a comment does not); as the champion of a pipeline of its own it answers `zhpipe
    predict`, `api.load_model` on raw text and `mlflow models serve`."""
    done = run(capsys, project, "run")
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    found = [
        *project.rglob("checks-p.json"),
        *Path(os.environ.get("ZHPIPE_DATA") or project).rglob("checks-p.json"),
    ]
    record = json.loads(found[0].read_text())
    verdicts = [
        v
        for judged in record["judged"].values()
        for v in judged["verdicts"]
        if v["check"] == "exclaiming"
    ]
    assert verdicts and verdicts[0]["passed"] is True and verdicts[0]["severity"] == "block", record
    clean = newest(project, "clean")
    bad = pd.read_parquet(clean / "quarantine.parquet")
    assert (bad["reason"] == "rule:my_rules:drop_symbol_only").sum() == 6, bad[["text", "reason"]]
    assert (
        json.loads((clean / "manifest.json").read_text())["metrics"][
            "dropped_rule_drop_symbol_only"
        ]
        == 6
    )
    comparison = pd.read_csv(newest(project, "evaluate") / "comparison.csv")
    assert {"tfidf_lr", "fasttext", "char_svc"} <= set(comparison["model"]), comparison
    svc = comparison.set_index("model").loc["char_svc"]
    assert svc["test_accuracy"] > 0.7, comparison  # a real model, not chance
    saved = newest(project, "train.char_svc") / "char_svc"
    assert {"model.skops", "estimator.json", "vocabularies.json", "code"} <= {
        p.name for p in saved.iterdir()
    }
    assert (saved / "code" / "my_models.py").is_file()
    # LinearSVC: no proba
    assert json.loads((saved / "estimator.json").read_text())["scores"] == "decision"

    models = project / "my_models.py"
    models.write_text(
        MODELS.replace("def char_svc", "# the team's standard\ndef char_svc"), encoding="utf-8"
    )
    assert "code of my_models.py changed" not in run(capsys, project, "status").stdout
    models.write_text(MODELS.replace("(1, 3)", "(1, 2)"), encoding="utf-8")
    status = run(capsys, project, "status").stdout
    assert "code of my_models.py changed" in status, status
    stale = {
        line.split("│")[1].strip()
        for line in status.splitlines()
        if "│ stale" in line or "│ missing" in line
    }
    # its unit and its evaluation, and the stages that gather them; nothing of the other models
    assert stale == {"train.char_svc", "train", "evaluate.char_svc", "evaluate"}, status
    models.write_text(MODELS, encoding="utf-8")

    # a pipeline of its own over the same corpus: every stage reused, the team's model its only one,
    # its champion
    config = project / "pipelines.yaml"
    yaml = config.read_text(encoding="utf-8")
    name = yaml.split("pipelines:\n", 1)[1].split(":", 1)[0].strip()
    body = yaml.split("pipelines:\n", 1)[1].split("\n", 1)[1]
    config.write_text(
        yaml + f"  svc-only:\n{body.replace('[tfidf_lr, fasttext, char_svc]', '[char_svc]')}",
        encoding="utf-8",
    )
    done = run(capsys, project, "run", "svc-only")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    from mlflow import MlflowClient

    champion = MlflowClient().get_model_version_by_alias("zhpipe-svc-only", "champion")
    assert champion.tags["zhpipe.model"] == "char_svc", champion.tags
    texts = ["房间很干净，服务也好", "早餐太差了，再也不来"]
    predicted = run(capsys, project, "predict", "--pipeline", "svc-only", "--jsonl", *texts)
    assert predicted.returncode == 0, predicted
    answers = [json.loads(line) for line in predicted.stdout.splitlines() if line.startswith("{")]
    assert [a["label"] for a in answers] and all(a["label"] in ("0", "1") for a in answers), (
        predicted.stdout
    )

    from flows import api
    from flows.plan import project as current

    # load_model(project=) makes it the current one
    monkeypatch.setattr(current, "_CURRENT", current._CURRENT)
    answer = api.load_model("svc-only", "char_svc", project=project)(texts)
    assert list(answer["label"]) == [a["label"] for a in answers] and list(answer["status"]) == [
        "ok",
        "ok",
    ]
    assert name  # the first pipeline keeps its own champion

    served = serve_rest(project, "models:/zhpipe-svc-only@champion", texts)
    assert [p["label"] for p in served] == [a["label"] for a in answers], served


def serve_rest(project: Path, uri: str, texts: list[str]) -> list[dict]:
    """`mlflow models serve -m URI` as a user runs it in the project, asked over REST for
    `texts`."""
    import httpx

    from tests.helpers.serving import mlflow_serving

    with mlflow_serving(uri, project) as base:
        answer = httpx.post(f"{base}/invocations", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


@pytest.mark.e2e
def test_a_check_of_ones_own_holds_like_the_built_in_ones(project, capsys):
    """A blocking check of the team's whose figure is over its threshold stops the run before
    training, named in one line, like a built-in check."""
    (project / "my_checks.py").write_text(
        CHECKS.replace(".mean())", ".mean()) + 1.0"), encoding="utf-8"
    )
    done = run(capsys, project, "run", "--to", "split")
    printed = done.stdout + done.stderr
    assert done.returncode != 0 and "check exclaiming FAILED" in printed, printed[-3000:]


def test_a_rule_file_others_can_write_is_refused_before_anything_runs(project, capsys):
    (project / "my_rules.py").chmod(0o666)
    done = run(capsys, project, "run", "--to", "clean")
    assert done.returncode == 2, done
    assert "my_rules.py can be written by other users" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "run" not in done.stdout.lower() or "clean" not in done.stdout  # nothing built


def test_a_missing_function_is_one_line_with_a_did_you_mean(project, capsys):
    config = project / "pipelines.yaml"
    config.write_text(
        config.read_text(encoding="utf-8").replace("drop_symbol_only]", "drop_symbols_only]"),
        encoding="utf-8",
    )
    done = run(capsys, project, "run", "--to", "clean")
    assert done.returncode != 0
    assert (
        "my_rules has no function drop_symbols_only; did you mean my_rules:drop_symbol_only?"
        in done.stderr
    ), done


def test_a_malformed_reference_is_a_config_error(tmp_path):
    from tasks.classification.clean import Params
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="expected module:function"):
        Params(rules=["my_rules.drop_symbol_only"])


def test_an_installed_packages_rule_is_found_after_the_project_folder(tmp_path, monkeypatch):
    """`acme_nlp.rules:strip` from a package on sys.path; a module of the same name in the project
    folder wins."""
    from tasks.util.usercode import CodeRef, load

    site = tmp_path / "site"
    (site / "acme_nlp").mkdir(parents=True)
    (site / "acme_nlp" / "__init__.py").write_text("")
    (site / "acme_nlp" / "rules.py").write_text("def strip(text):\n    return text.strip('~')\n")
    monkeypatch.syspath_prepend(str(site))
    for name in [m for m in sys.modules if m == "acme_nlp" or m.startswith("acme_nlp.")]:
        monkeypatch.delitem(sys.modules, name)
    project = tmp_path / "project"
    project.mkdir()
    assert load(CodeRef.parse("acme_nlp.rules:strip", "t"), project, "t")("~好~") == "好"
    os.chmod(site / "acme_nlp" / "rules.py", 0o664)
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="rules.py can be written by other users"):
        load(CodeRef.parse("acme_nlp.rules:strip", "t"), project, "t")


FAMILY = '''"""acme_nlp's model family: multinomial naive Bayes over character n-grams, saved as
JSON and npz."""
import json
import time

import numpy as np
from pydantic import Field

from tasks.core import Section
from tasks.models import ModelSpec


class Params(Section):
    alpha: float = Field(0.5, gt=0)


def _vectorizer():
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(analyzer="char", ngram_range=(1, 2), n_features=2**16,
                             alternate_sign=False, norm=None)


def train(i):
    from sklearn.naive_bayes import MultinomialNB

    t0 = time.perf_counter()
    frame = i.train
    y = frame["label"].map({label: n for n, label in enumerate(i.labels)}).to_numpy()
    model = MultinomialNB(alpha=i.section.alpha).fit(_vectorizer().transform(frame["text"]), y)
    folder = i.out / i.name
    folder.mkdir()
    np.savez(folder / "weights.npz", log_prob=model.feature_log_prob_, prior=model.class_log_prior_,
             classes=model.classes_)
    (folder / "config.json").write_text(json.dumps({"labels": i.labels}))
    return {"path": i.name, "kind": "char_nb", "seconds": time.perf_counter() - t0, "history": []}


def load(folder):
    n = len(json.loads((folder / "config.json").read_text())["labels"])
    with np.load(folder / "weights.npz", allow_pickle=False) as w:
        log_prob, prior, classes = w["log_prob"], w["prior"], w["classes"]

    def predict(df):
        scores = _vectorizer().transform(df["text"]) @ log_prob.T + prior
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        out = np.zeros((len(df), n), dtype=np.float32)
        out[:, classes] = scores / scores.sum(axis=1, keepdims=True)
        return out

    return predict


SPECS = [ModelSpec("char_nb", Params, train, load=load, shared=(), cost=0,
                   about="naive Bayes over character 1-2-grams (acme_nlp)")]
'''


@pytest.fixture
def acme(tmp_path, monkeypatch):
    """A real distribution, `acme-nlp` 0.1, on sys.path: its package and its dist-info with an entry
    point of the group `zhpipe.models`, as `pip install acme-nlp` leaves them; its family
    registered, and forgotten after."""
    from tasks.models import families
    from tasks.stages import KINDS

    site = tmp_path / "site"
    (site / "acme_nlp").mkdir(parents=True)
    (site / "acme_nlp" / "__init__.py").write_text("")
    (site / "acme_nlp" / "families.py").write_text(FAMILY)
    (site / "acme_nlp" / "rules.py").write_text("def strip(text):\n    return text.strip('~')\n")
    info = site / "acme_nlp-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-nlp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[zhpipe.models]\nnb = acme_nlp.families:SPECS\n")
    # another test's acme_nlp
    forget = [m for m in sys.modules if m == "acme_nlp" or m.startswith("acme_nlp.")]
    for name in forget:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))
    families.register({name: kind.models for name, kind in KINDS.items()})
    yield site
    KINDS["classification"].models.pop("char_nb", None)
    families.FOUND.pop("char_nb", None)
    for name in [m for m in sys.modules if m == "acme_nlp" or m.startswith("acme_nlp.")]:
        sys.modules.pop(name)


@pytest.mark.e2e
def test_a_family_from_an_installed_package_trains_beside_the_built_in_ones(acme, project, capsys):
    """`acme-nlp`'s entry point registers `char_nb` for classification: `zhpipe models` lists it
    with its distribution, it gets its `train.char_nb` section, trains and is compared like a
    built-in model; a rule from the same package cleans."""
    listed = run(capsys, project, "models").stdout
    assert [
        line for line in listed.splitlines() if line.startswith("char_nb") and "acme-nlp" in line
    ], listed
    config = project / "pipelines.yaml"
    yaml = config.read_text(encoding="utf-8").replace("[tfidf_lr, fasttext, char_svc]", "[char_nb]")
    config.write_text(
        yaml.replace(
            "rules: [my_rules:drop_symbol_only]",
            "rules: [my_rules:drop_symbol_only, acme_nlp.rules:strip]",
        ),
        encoding="utf-8",
    )
    done = run(capsys, project, "run", "--set", "train.char_nb.alpha=0.3")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    comparison = pd.read_csv(newest(project, "evaluate") / "comparison.csv")
    assert list(comparison["model"]) == ["char_nb"] and comparison["test_accuracy"].iloc[0] > 0.6, (
        comparison
    )
    manifest = json.loads((newest(project, "train.char_nb") / "manifest.json").read_text())
    assert manifest["params"]["char_nb"] == {"alpha": 0.3}


def test_an_estimator_that_raises_fails_its_unit_only(project, capsys):
    """The others still train and are kept; the run ends in one line naming the model and its
    error's last line."""
    (project / "my_models.py").write_text(
        MODELS + "\n\ndef broken(C=1.0):\n    raise ValueError('no such kernel')\n",
        encoding="utf-8",
    )
    config = project / "pipelines.yaml"
    yaml = config.read_text(encoding="utf-8").replace(
        "[tfidf_lr, fasttext, char_svc]", "[tfidf_lr, char_svc]"
    )
    config.write_text(
        yaml.replace("estimator: my_models:char_svc", "estimator: my_models:broken"),
        encoding="utf-8",
    )
    done = run(capsys, project, "run", "--to", "train")
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert "train: 1 model failed: char_svc" in line and "ValueError: no such kernel" in line, (
        done.stderr[-2000:]
    )
    assert "trained and kept: tfidf_lr" in line
    assert newest(project, "train.tfidf_lr").exists()


def test_a_teams_model_is_known_only_to_the_pipelines_that_declare_it(project):
    """Another pipeline of the same file that names `char_svc` without declaring it: an unknown
    model, in one line (never the first pipeline's section, read in the same process)."""
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    config = project / "pipelines.yaml"
    yaml = config.read_text(encoding="utf-8")
    body = yaml.split("pipelines:\n", 1)[1].split("\n", 1)[1]
    other = body.replace(TRAIN, "        models: [tfidf_lr, char_svc]\n")
    config.write_text(yaml + f"  other:\n{other}", encoding="utf-8")
    assert "char_svc" in load_pipeline("p", config).models()
    with pytest.raises(ConfigError, match="unknown model 'char_svc'"):
        load_pipeline("other", config)
