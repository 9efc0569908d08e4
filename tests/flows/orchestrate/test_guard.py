"""What a deployment run may set (flows/orchestrate/guard.py), decided from the deployment's own
parameters."""

from pathlib import Path

import pytest
import yaml

from flows.orchestrate.guard import check_run
from tasks.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def project(tmp_path):
    doc = {
        "pipelines": {
            "p": {
                "source": {"path": "x.csv"},
                "parameters": {
                    "overrides": ["train.epochs=1"],
                    "allow_overrides": ["split.seed", "segment.*"],
                },
            }
        }
    }
    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return {"pipeline": "p", "project_dir": str(tmp_path), "overrides": ["train.epochs=1"]}


def test_the_deployments_own_parameters_and_allowed_overrides_pass(project):
    check_run(dict(project), project)
    check_run(
        {
            **project,
            "overrides": ["train.epochs=1", "split.seed=3", "segment.stopwords=dicts/stop.txt"],
        },
        project,
    )
    check_run({**project, "stages": ["download"], "force": [], "verify": True}, project)


@pytest.mark.parametrize(
    "changed, named",
    [
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
    ],
)
def test_refused_parameters_are_named_in_one_line(project, changed, named):
    with pytest.raises(
        ConfigError,
        match=r"deployment run refused: it may not set .*"
        + named.replace("[", r"\[").replace("]", r"\]"),
    ):
        check_run({**project, **changed}, project)


def test_runs_outside_a_deployment_are_not_checked(prefect_harness, project):
    check_run({**project, "storage": "s3://anywhere"})  # no deployment: the user's own run


@pytest.mark.parametrize(
    "assignment",
    [
        # a mapping whose leaves reach out: the URL through a YAML escape, a secret's variable name
        'augment.backtranslation={backend: http, http: {url: "http\\x3a//127.0.0.1:4399", '
        "api_key_env: SECRET}}",
        "segment.user_dict={checkpoint: /etc}",
        'segment.user_dict={checkpoint: "\\x2froot"}',
        "segment.stopwords=[ok.txt, /etc/passwd]",
        "segment.user_dict={a: {b: [~/.ssh/id_rsa]}}",
        "segment.user_dict={a: [1, 2",  # not YAML: refused, not guessed
    ],
)
def test_override_values_are_parsed_as_the_config_parses_them(project, assignment):
    """The guard reads an allowed override's value exactly as the config does and checks every
    leaf."""
    allowed = {**project}
    (Path(project["project_dir"]) / "pipelines.yaml").write_text(
        yaml.safe_dump(
            {
                "pipelines": {
                    "p": {
                        "source": {"path": "x.csv"},
                        "parameters": {
                            "overrides": ["train.epochs=1"],
                            "allow_overrides": ["segment.*", "augment.*"],
                        },
                    }
                }
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="deployment run refused"):
        check_run({**allowed, "overrides": ["train.epochs=1", assignment]}, allowed)


def test_a_symlink_out_of_the_project_is_refused(project):
    root = Path(project["project_dir"])
    (root / "dicts").symlink_to("/etc")
    with pytest.raises(ConfigError, match=r"overrides\[segment.stopwords\]"):
        check_run(
            {**project, "overrides": ["train.epochs=1", "segment.stopwords=dicts/passwd"]}, project
        )


def test_what_is_allowed_comes_from_the_workers_file_not_the_server(project, monkeypatch):
    """A PATCH of the deployment's parameters on the server (its `overrides`) does not make them the
    deployment's own: they are checked against the worker's pipelines.yaml like any other."""
    from flows.orchestrate.guard import expected_parameters

    # the worker's project then comes from the deployment's project_dir
    monkeypatch.delenv("ZHPIPE_PROJECT")
    # PATCHed on the server
    server = {**project, "overrides": ["train.epochs=1", "segment.stopwords=/etc/passwd"]}
    expected = expected_parameters("p", server)
    assert expected["overrides"] == ["train.epochs=1"] and expected["allow_overrides"] == [
        "split.seed",
        "segment.*",
    ]
    with pytest.raises(ConfigError, match=r"overrides\[segment.stopwords\]"):
        check_run(server, expected)
    check_run({**project}, expected)


def test_the_cli_refuses_a_secrets_variable_in_a_mapping():
    from flows.plan.config import load_pipeline

    with pytest.raises(ConfigError, match="names of environment variables holding secrets"):
        load_pipeline(
            "smoke",
            ROOT / "pipelines.yaml",
            [
                'augment.backtranslation={backend: http, http: {url: "http://127.0.0.1:1", '
                "api_key_env: HOME}}"
            ],
        )


def test_a_yaml_alias_bomb_is_one_line_not_gigabytes(tmp_path):
    from flows.plan.config import load_pipeline

    bomb = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")
    )
    (tmp_path / "p.yaml").write_text(
        bomb + "pipelines:\n  x: {source: {path: a.csv}}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="YAML aliases expand to"):
        load_pipeline("x", tmp_path / "p.yaml")
    with pytest.raises(ConfigError, match="YAML aliases expand to"):
        load_pipeline(
            "smoke",
            ROOT / "pipelines.yaml",
            ["train.models=" + bomb.replace("\n", ", ").join("{}")],
        )


def test_zhpipe_pools_fix_the_command_and_the_environment():
    """The base job template of a pool zhpipe creates has no `command` or `env` variable to
    override, and a deployment's job variables hold no storage or tracking URL."""
    from flows.orchestrate.deploy import job_env, job_template

    template = job_template()
    assert (
        "command" not in template["variables"]["properties"]
        and "env" not in template["variables"]["properties"]
    )
    assert (
        template["job_configuration"]["command"] is None
        and template["job_configuration"]["env"] == job_env()
    )
    assert set(job_env()) == {"PREFECT_LOGGING_EXTRA_LOGGERS"}
