import pytest

from flows.plan.config import list_pipelines, load_pipeline
from tasks.errors import ConfigError


def write(tmp_path, text):
    path = tmp_path / "pipelines.yaml"
    path.write_text(text, encoding="utf-8")
    return path


BASE = """
pipelines:
  p:
    source: {path: x.csv}
"""


def test_defaults_and_overrides(tmp_path):
    cfg = load_pipeline(
        "p",
        write(tmp_path, BASE),
        ["train.epochs=2", "embed.word2vec.sg=true", "segment.mode=search"],
    )
    assert cfg.stages.train.epochs == 2
    assert cfg.stages.embed.word2vec.sg is True
    assert cfg.stages.segment.mode == "search"
    assert cfg.stages.split.train == 0.8


def test_unknown_key_names_it_and_lists_allowed(tmp_path):
    path = write(tmp_path, BASE + "    stages:\n      train:\n        epoch: 3\n")
    with pytest.raises(ConfigError) as e:
        load_pipeline("p", path)
    msg = str(e.value)
    assert "stages.train.epoch" in msg and "epochs" in msg and "patience" in msg


def test_wrong_type_names_key(tmp_path):
    with pytest.raises(ConfigError, match=r"stages\.train\.epochs.*integer"):
        load_pipeline("p", write(tmp_path, BASE), ["train.epochs=many"])


def test_unknown_stage_in_set(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'stages.trian'"):
        load_pipeline("p", write(tmp_path, BASE), ["trian.epochs=2"])


def test_missing_pipeline_lists_declared(tmp_path):
    with pytest.raises(ConfigError, match="declared: p"):
        load_pipeline("nope", write(tmp_path, BASE))


def test_source_override_replaces_source(tmp_path):
    cfg = load_pipeline(
        "p",
        write(tmp_path, BASE),
        source_overrides={"path": "other.csv", "text_column": "content", "label_column": "cat"},
    )
    assert (
        cfg.source.path,
        cfg.source.text_column,
        cfg.source.label_column,
        cfg.source.sha256,
    ) == (
        "other.csv",
        "content",
        "cat",
        None,
    )


def test_split_fractions_must_sum_to_one(tmp_path):
    with pytest.raises(ConfigError, match="sum to 1"):
        load_pipeline("p", write(tmp_path, BASE), ["split.train=0.9"])


def test_project_pipelines_validate():
    for name in ("chnsenticorp", "full", "chnsenticorp-bt", "smoke"):
        assert load_pipeline(name).name == name


def test_set_values_take_the_field_type(tmp_path):
    path = write(tmp_path, BASE)
    cfg = load_pipeline(
        "p",
        path,
        [
            "source.sha256=0012abababababababababababababababababababababababababababababab",
            "train.models=[textcnn]",
            "vocab.max_size=null",
            "split.seed=3",
            "embed.word2vec.hs=true",
        ],
    )
    assert cfg.source.sha256 == "0012" + "ab" * 30 and cfg.stages.train.models == ["textcnn"]
    assert (
        cfg.stages.vocab.max_size is None
        and cfg.stages.split.seed == 3
        and cfg.stages.embed.word2vec.hs is True
    )


@pytest.mark.parametrize(
    "sets, message",
    [
        (
            ["train.bert.hidden_size=100"],
            r"bert.hidden_size \(100\) must be a multiple of bert.num_heads \(3\)",
        ),
        (
            ["train.bert.word_adapter=true", "train.bert.adapter_layer=2"],
            r"adapter_layer \(2\) must be below the last layer \(2\)",
        ),
        (
            ["train.models=[transformer]", "embed.word2vec.vector_size=30"],
            r"d_model 30 .* multiple of num_heads \(4\)",
        ),
        (["train.models=[rnn_lm, ngram_lm]"], "at least one classifier"),
    ],
)
def test_model_shapes_are_checked_before_anything_runs(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        load_pipeline("p", write(tmp_path, BASE), sets)


@pytest.mark.parametrize(
    "schedule, needle",
    [
        ("{cron: '61 * * * *'}", "not a valid cron line"),
        ("{cron: '0 3 * * *', timezone: Mars/Olympus}", "unknown time zone 'Mars/Olympus'"),
        ("{cron: '0 3 * * *', interval: 60}", "exactly one of `cron` or `interval`"),
        ("{interval: -5}", "'schedule.interval'"),
    ],
)
def test_bad_schedule_is_one_clear_error(tmp_path, schedule, needle):
    with pytest.raises(ConfigError) as e:
        load_pipeline("p", write(tmp_path, BASE + f"    schedule: {schedule}\n"))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_deployment_keys_do_not_change_stage_keys(tmp_path):
    from flows.plan.keys import plan_keys

    plain = load_pipeline("p", write(tmp_path, BASE))
    deployed = load_pipeline(
        "p",
        write(
            tmp_path,
            BASE + "    schedule: {interval: 3600}\n    executor: dask\n    storage: s3://b/z\n",
        ),
        ["train.work_pool=gpu"],
    )
    assert deployed.stages.train.work_pool == "gpu" and deployed.schedule.interval == 3600
    assert deployed.executor == "dask" and plan_keys(plain) == plan_keys(deployed)
    with pytest.raises(ConfigError, match="unknown key 'runner' \\(did you mean 'executor'\\?"):
        # its name before: named, not read
        load_pipeline("p", write(tmp_path, BASE + "    runner: dask\n"))
    with pytest.raises(ConfigError, match="'executor'"):
        load_pipeline("p", write(tmp_path, BASE + "    executor: yarn\n"))


def test_set_source_sha256_applies_to_a_source_given_with_source(tmp_path):
    path = write(tmp_path, BASE)
    digest = "ab" * 32
    cfg = load_pipeline(
        "p",
        path,
        [f"source.sha256={digest}"],
        {"path": "https://example.org/c.csv", "text_column": "review"},
    )
    assert cfg.source.path == "https://example.org/c.csv" and cfg.source.sha256 == digest


def test_pipeline_names_are_checked_when_the_file_is_loaded(tmp_path):
    path = tmp_path / "pipelines.yaml"
    path.write_text("pipelines:\n  'bad/name':\n    source: {path: x.csv}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="pipeline name 'bad/name' is not allowed"):
        list_pipelines(path)


def test_secret_env_names_cannot_be_overridden(tmp_path):
    path = write(tmp_path, BASE)
    with pytest.raises(ConfigError, match="declared in pipelines.yaml, not in overrides"):
        load_pipeline("p", path, ["augment.backtranslation.http.api_key_env=AWS_SECRET_ACCESS_KEY"])


def test_credentials_in_urls_never_reach_the_config(tmp_path):
    from tasks.util.urls import reveal

    path = write(tmp_path, BASE)
    real = "https://user:SECRET@example.org/c.csv?X-Amz-Signature=SIG123&part=1"
    cfg = load_pipeline("p", path, [f"source.url={real}"])
    dumped = cfg.model_dump_json() + str(cfg.flat_params())
    assert "SECRET" not in dumped and "SIG123" not in dumped and "part=1" in dumped
    assert reveal(cfg.source.url) == real


def test_a_misspelt_key_gets_a_suggestion():
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"^--set train.epoch=2: unknown key 'stages.train.epoch' \(did you mean 'epochs'\? "
        r"allowed keys: models, epochs",
    ):
        # the command line's typo, not the file's
        load_pipeline("smoke", overrides=["train.epoch=2"])
    with pytest.raises(
        ConfigError, match=r"^--set train.budget=soon: 'stages.train.budget': Value error, a budget"
    ):
        load_pipeline("smoke", overrides=["train.budget=soon"])


def test_debug_goes_before_or_after_the_command(capsys):
    from flows.cli import main

    assert main(["stages", "--debug"]) == 0 and main(["--debug", "stages"]) == 0
    assert capsys.readouterr().out.count("task classification") == 2


def test_every_command_and_option_has_help():
    import argparse

    from flows.cli import _parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif not action.help and action.dest != "help":
                missing.append(" ".join([*path, *(action.option_strings or [action.dest])]))

    walk(_parser(), ["zhpipe"])
    assert missing == []


def test_each_load_reads_the_file_as_it_is_now(tmp_path):
    """No cache between a file and its config (a run parses once, where it starts, and hands the
    typed config down: tests/flows/plan/test_request.py): a load after the file changed reads the
    change, and each load is the caller's own copy."""
    path = write(tmp_path, BASE)
    first = load_pipeline("p", path, ["train.epochs=2"])
    second = load_pipeline("p", path, ["train.epochs=2"])
    assert first == second and first is not second
    second.stages.train.epochs = 4
    assert load_pipeline("p", path, ["train.epochs=2"]).stages.train.epochs == 2
    path.write_text(BASE.replace("x.csv", "y.csv"), encoding="utf-8")
    assert load_pipeline("p", path, ["train.epochs=2"]).source.path == "y.csv"


def test_source_keeps_the_pipelines_columns_unless_given():
    """`--source FILE` reads FILE as the pipeline reads its own corpus (its columns), unless told
    otherwise."""
    from flows.plan.config import load_pipeline

    own = load_pipeline("smoke").source
    other = load_pipeline(
        "smoke",
        source_overrides={"path": "elsewhere.csv", "text_column": None, "label_column": None},
    ).source
    assert (other.path, other.text_column, other.label_column) == (
        "elsewhere.csv",
        own.text_column,
        own.label_column,
    )
    given = load_pipeline(
        "smoke",
        source_overrides={"path": "elsewhere.csv", "text_column": "content", "label_column": None},
    ).source
    assert given.text_column == "content" and given.label_column == own.label_column


def test_another_corpus_is_tracked_under_a_name_of_its_own():
    """`--source FILE` keeps the pipeline's settings but not its experiment or registered model: a
    run on another corpus never competes with the bundled corpus' champion."""
    assert load_pipeline("smoke").identity == "smoke"
    other = load_pipeline("smoke", source_overrides={"path": "/data/外卖 reviews/waimai_10k.csv"})
    assert other.identity == "smoke-waimai_10k" and other.name == "smoke"
    assert (
        load_pipeline(
            "smoke", source_overrides={"path": "https://example.org/a/msra.bio.gz"}
        ).identity
        == "smoke-msra"
    )
    assert (
        load_pipeline("smoke", source_overrides={"path": "/x/数据.csv"}).identity == "smoke-source"
    )


def test_fasttext_embeddings_need_the_fasttext_vectors():
    """The init template turns the embed stage's fastText vectors off: a network asked to start from
    them says so before the run, not when the train stage looks for the file."""
    from flows.plan.config import load_pipeline
    from tasks.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"train.embeddings: fasttext, but embed.fasttext.enabled is false \(the networks",
    ):
        load_pipeline(
            "smoke",
            overrides=[
                "embed.fasttext.enabled=false",
                "train.embeddings=fasttext",
                "train.models=[tfidf_lr,textcnn]",
            ],
        )
    assert load_pipeline(
        "smoke", overrides=["embed.fasttext.enabled=false", "train.models=[tfidf_lr,textcnn]"]
    )
