"""What a deployment run may set (flows/guard.py), decided from the deployment's own parameters."""
from pathlib import Path

import pytest
import yaml

from flows.guard import check_run
from tasks.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path):
    doc = {"pipelines": {"p": {"source": {"path": "x.csv"}, "parameters": {"overrides": ["train.epochs=1"],
                                                                          "allow_overrides": ["split.seed", "segment.*"]}}}}
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return {"pipeline": "p", "project_dir": str(tmp_path), "overrides": ["train.epochs=1"]}


def test_the_deployments_own_parameters_and_allowed_overrides_pass(project):
    check_run(dict(project), project)
    check_run({**project, "overrides": ["train.epochs=1", "split.seed=3", "segment.stopwords=dicts/stop.txt"]}, project)
    check_run({**project, "stages": ["download"], "force": [], "verify": True}, project)


@pytest.mark.parametrize("changed, named", [
    ({"storage": "s3://elsewhere/zhpipe"}, "storage"),
    ({"dask": "tcp://10.0.0.9:8786"}, "dask"),
    ({"config_file": "/tmp/other.yaml"}, "config_file"),
    ({"source": {"path": "/etc/passwd"}}, "source"),
    ({"project_dir": "/"}, "project_dir"),
    ({"pipeline": "other"}, "pipeline"),
    ({"overrides": ["train.epochs=1", "train.lr=1"]}, "overrides[train.lr]"),
    ({"overrides": ["segment.stopwords=/etc/passwd"]}, "overrides[segment.stopwords]"),
    ({"overrides": ["segment.user_dict=../../secrets.txt"]}, "overrides[segment.user_dict]"),
    ({"overrides": ["segment.user_dict=~/.ssh/id_rsa"]}, "overrides[segment.user_dict]"),
    ({"overrides": ["source.url=http://elsewhere/c.csv"]}, "overrides[source.url]"),
    ({"parent_run_id": "../../x"}, "parent_run_id"),
])
def test_refused_parameters_are_named_in_one_line(project, changed, named):
    with pytest.raises(ConfigError, match=r"deployment run refused: it may not set .*" + named.replace("[", r"\[").replace("]", r"\]")):
        check_run({**project, **changed}, project)


def test_runs_outside_a_deployment_are_not_checked(prefect_harness, project):
    check_run({**project, "storage": "s3://anywhere"})  # no deployment: the user's own run
