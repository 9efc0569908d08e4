"""A run's request (flows/plan/request.py): made once from the command line, parsed once, carried to
the flow as plain parameters that hold no secret, and refused in one line when a deployment run
passes the wrong types."""

import json

import pytest

from flows.plan.request import RunRequest
from tasks.errors import ZhpipeError


def _args(*argv):
    from flows.cli import _parser

    return _parser().parse_args(["run", *argv])


def test_the_command_lines_request_is_the_one_the_flow_parses(monkeypatch):
    import flows.plan.config
    from flows.cli.common import request_of
    from tasks.util.urls import reveal

    calls = []
    parse = flows.plan.config._parse
    monkeypatch.setattr(flows.plan.config, "_parse", lambda *a: calls.append(a) or parse(*a))
    real = "https://user:SECRET@example.org/c.csv?X-Amz-Signature=SIG123&part=1"
    request = request_of(
        _args("smoke", "--set", "train.epochs=2", "--source", real, "--allow-unverified")
    )
    config = request.config()
    parameters = json.dumps(request.parameters())  # what Prefect records: JSON, no credentials
    assert "SECRET" not in parameters and "SIG123" not in parameters and "part=1" in parameters
    assert "source.allow_unverified=true" in request.overrides and config.source.allow_unverified
    # the flow's side: the same request from its parameters, the config handed down typed, the URL
    # revealed here
    again = RunRequest.of(**request.parameters())
    assert again == request and hash(again) == hash(request)
    assert again.typed(config) is config and len(calls) == 1
    assert reveal(config.source.path) == real and config.stages.train.epochs == 2
    # a deployment's run has only the plain values: it parses them, to the same config
    assert again.typed() == config and len(calls) == 2


def test_one_run_parses_its_config_once(monkeypatch, tmp_path, capsys):
    """`zhpipe run --set ...`, start to end: pipelines.yaml and the --set lines are parsed once,
    where the command starts; the flow, its stages and its tracking receive the typed config."""
    import flows.plan.config
    from tests.helpers.cli import in_process

    calls = []
    parse = flows.plan.config._parse
    monkeypatch.setattr(flows.plan.config, "_parse", lambda *a: calls.append(a[0]) or parse(*a))
    done = in_process(
        capsys,
        "run",
        "smoke",
        "--to",
        "clean",
        "--set",
        "clean.min_chars=2",
        "--storage",
        tmp_path / "store",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert calls == ["smoke"]


@pytest.mark.parametrize("parsed", [{"name": "smoke"}, "smoke"])
def test_a_parsed_config_must_be_typed(parsed):
    """A deployment's run may pass anything the Prefect API accepts: a `parsed` that is not a typed
    config is one line, never trusted."""
    with pytest.raises(ZhpipeError, match="parsed: expected the typed config of pipeline 'smoke'"):
        RunRequest.of("smoke").typed(parsed)


def test_a_secret_inside_an_override_is_kept_in_this_process_only():
    from tasks.util.urls import reveal

    real = "https://bob:PW@example.org/hook"
    request = RunRequest.of("smoke", [f"source.path={real}"])
    assert "PW" not in json.dumps(request.parameters()) and "PW" not in request.changed()
    assert reveal(request.config().source.path) == real


@pytest.mark.parametrize(
    "given, needle",
    [
        ({"pipeline": 3}, "pipeline: expected a pipeline name, got int"),
        (
            {"pipeline": "smoke", "overrides": "train.epochs=2"},
            "overrides: expected a list of STAGE.PARAM=VALUE lines",
        ),
        ({"pipeline": "smoke", "overrides": [2]}, "overrides: expected a list"),
        ({"pipeline": "smoke", "source": ["x.csv"]}, "source: expected a mapping"),
        ({"pipeline": "smoke", "config_file": 7}, "config_file: expected a path, got int"),
    ],
)
def test_parameters_of_the_wrong_type_are_one_clear_line(given, needle):
    with pytest.raises(ZhpipeError, match=needle):
        RunRequest.of(**given)


def test_a_tuning_trial_adds_its_settings_to_the_request():
    from dataclasses import replace

    request = RunRequest.of("smoke", ["train.epochs=2"])
    trial = replace(
        request, overrides=request.overrides + ("train.models=[tfidf_lr]", "train.tfidf_lr.C=0.5")
    )
    config = trial.config()
    assert config.models() == ["tfidf_lr"] and config.stages.train.tfidf_lr.C == 0.5
    assert config.stages.train.epochs == 2 and request.config().models() != ["tfidf_lr"]
