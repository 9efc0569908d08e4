"""Nothing that crosses a trust boundary is unpickled: a pickle payload planted in a stage output
(with a matching manifest, as someone who can write the store could make) or in a logged model's
artifacts is refused on load, and its code never runs."""

import json
import pickle
from pathlib import Path

import mlflow
import pytest
import torch

from flows.orchestrate.pipeline import pipeline_flow
from flows.track.tracker import client
from tasks.stages import MODELS
from tasks.util.io import file_sha256
from tests.helpers.runs import without_profile

pytestmark = pytest.mark.e2e
SETS = ["train.models=[tfidf_lr, textcnn]", "split.seed=11"]


class Payload:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def built(prefect_harness, tmp_path_factory):
    store = tmp_path_factory.mktemp("no-pickle")
    # its pictures are not read here
    out = pipeline_flow("smoke", overrides=SETS, storage=str(store), stages=without_profile())
    return store, {u["stage"]: u for u in out["units"]}


def plant(path: Path, marker: Path) -> None:
    torch.save({"state_dict": Payload(marker), "config": {}}, path)
    # the payload does work
    assert pickle.loads(pickle.dumps(Payload(marker))) is None and marker.exists()
    marker.unlink()


def test_a_payload_in_a_stage_output_never_runs(built, tmp_path):
    store, units = built
    unit = Path(units["train.textcnn"]["path"])
    marker = tmp_path / "pwned-store"
    plant(unit / "textcnn" / "model.pt", marker)
    # an attacker rewrites the manifest too
    manifest = json.loads((unit / "manifest.json").read_text())
    manifest["files"]["textcnn/model.pt"] = {
        "size": (unit / "textcnn" / "model.pt").stat().st_size,
        "sha256": file_sha256(unit / "textcnn" / "model.pt"),
    }
    (unit / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(pickle.UnpicklingError):
        MODELS["textcnn"].load(unit / "textcnn")
    with pytest.raises(pickle.UnpicklingError):  # the pipeline rescoring it fails the same way
        pipeline_flow(
            "smoke",
            overrides=SETS,
            storage=str(store),
            force=["evaluate"],
            stages=without_profile(),
        )
    assert not marker.exists()
    # no pickle files at all
    assert not any(p.suffix in (".pkl", ".joblib", ".pickle") for p in store.rglob("*"))


def test_a_payload_in_a_logged_models_artifacts_never_runs(built, tmp_path):
    _, units = built
    uri = client().get_run(units["train.tfidf_lr"]["run_id"]).data.tags["zhpipe.model_uri"]
    assert mlflow.pyfunc.load_model(uri).predict(["房间很干净"]).shape[0] == 1
    uri = client().get_run(units["train.textcnn"]["run_id"]).data.tags["zhpipe.model_uri"]
    location = client().get_logged_model(uri.removeprefix("models:/")).artifact_location
    # the pyfunc's copy of the weights
    weights = next(Path(location.removeprefix("file://")).rglob("model.pt"))
    marker = tmp_path / "pwned-artifact"
    plant(weights, marker)
    with pytest.raises(Exception, match="Unsupported global|Weights only load failed"):
        mlflow.pyfunc.load_model(uri).predict(["房间很干净"])
    assert not marker.exists()
    logged = Path(location.removeprefix("file://"))
    # models from code, no CloudPickle
    assert (logged / "pyfunc_model.py").is_file() and not list(logged.rglob("*.pkl"))
