"""Stage keys see every cause (params, upstream, code, library versions, named files) and `zhpipe
status` names the cause that made a stage stale."""

import os
from pathlib import Path

import pytest

from flows.orchestrate.pipeline import pipeline_flow, select_stages
from flows.plan import fingerprint
from flows.plan import keys as planner
from flows.plan.config import load_pipeline
from flows.plan.status import diff_causes, stage_states
from flows.plan.store import StageStore, stage_key

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e
BEFORE_SEGMENT = ("download", "clean", "split")
UNITS = ("train.fasttext", "train.textcnn", "evaluate.fasttext", "evaluate.textcnn")
FROM_SEGMENT = ("segment", "profile", "augment", "vocab", "embed", "train", "evaluate", *UNITS)


@pytest.fixture(scope="module")
def built(prefect_harness, tmp_path_factory):
    """The smoke pipeline built up to segment, with a user dictionary, in a store of its own."""
    folder = tmp_path_factory.mktemp("keys")
    (folder / "user.txt").write_text("很干净 10 a\n", encoding="utf-8")
    sets = [f"segment.user_dict={folder / 'user.txt'}"]
    pipeline_flow(
        "smoke", overrides=sets, storage=str(folder / "store"), stages=select_stages(stop="segment")
    )
    return {"store": StageStore(folder / "store"), "sets": sets, "dict": folder / "user.txt"}


def states(built, sets=()):
    causes = planner.plan(load_pipeline("smoke", overrides=built["sets"] + list(sets)))
    keys = {s: stage_key(c) for s, c in causes.items()}
    return keys, {r["stage"]: r for r in stage_states(built["store"], causes, keys)}


def changed(a: dict, b: dict) -> set[str]:
    return {s for s in a if a[s] != b[s]}


def test_a_param_rebuilds_its_stage_and_what_follows_and_status_says_which(built):
    keys, rows = states(built)
    assert [rows[s]["state"] for s in ("download", "clean", "split", "segment")] == ["cached"] * 4
    new_keys, rows = states(built, ["segment.hmm=false"])
    assert changed(keys, new_keys) == set(FROM_SEGMENT)
    assert rows["segment"]["state"] == "stale" and rows["segment"]["why"] == [
        "param segment.hmm: True -> False"
    ]


def test_one_models_param_changes_that_model_and_the_comparison_only(built):
    keys, _ = states(built)
    new_keys, _ = states(built, ["train.textcnn.lr=0.002"])
    assert changed(keys, new_keys) == {"train.textcnn", "train", "evaluate.textcnn", "evaluate"}
    old = planner.plan(load_pipeline("smoke", overrides=built["sets"]))["train.textcnn"]
    new = planner.plan(
        load_pipeline("smoke", overrides=built["sets"] + ["train.textcnn.lr=0.002"])
    )["train.textcnn"]
    assert diff_causes("train.textcnn", old, new) == ["param train.textcnn.lr: 0.001 -> 0.002"]


def test_a_shared_setting_changes_only_the_models_that_read_it():
    """`train.epochs` is read by the PyTorch models only: tfidf_lr and fastText keep their keys (and
    so stay cached, and are never registered twice); `train.seed` is read by all three."""
    sets = ["train.models=[tfidf_lr,fasttext,textcnn]"]
    plan = lambda extra: planner.plan_keys(load_pipeline("smoke", overrides=sets + extra))
    keys = plan([])
    epochs = changed(keys, plan(["train.epochs=2"]))
    assert epochs == {"train.textcnn", "train", "evaluate.textcnn", "evaluate"}
    seed = changed(keys, plan(["train.seed=8"]))
    assert {"train.tfidf_lr", "train.fasttext", "train.textcnn"} <= seed


def test_a_model_cannot_read_a_shared_setting_it_does_not_declare():
    from tasks.stages import MODELS

    params = load_pipeline("smoke").stages.train
    view = MODELS["tfidf_lr"].view(params)
    assert view.seed == params.seed and view.tfidf_lr == params.tfidf_lr
    with pytest.raises(
        AttributeError,
        match="model 'tfidf_lr' reads train.epochs, which its ModelSpec.shared does not declare",
    ):
        _ = view.epochs


def _patched_source(monkeypatch, tmp_path, module: str, edit):
    original = fingerprint.source_file(module)
    copy = tmp_path / f"{module}.py"
    copy.write_text(edit(original.read_text(encoding="utf-8")), encoding="utf-8")
    real = fingerprint.source_file
    monkeypatch.setattr(
        fingerprint, "source_file", lambda name: copy if name == module else real(name)
    )
    fingerprint._module_info.cache_clear()


def test_code_changes_count_comments_do_not(built, monkeypatch, tmp_path):
    keys, _ = states(built)
    _patched_source(
        monkeypatch,
        tmp_path,
        "tasks.shared.segment",
        lambda s: (
            s.replace('"""Stage `segment`', '# a comment\n"""Stage `segment`, reworded', 1)
            + "\n# the end\n"
        ),
    )
    assert states(built)[0] == keys  # comments, docstrings and formatting are not code
    _patched_source(monkeypatch, tmp_path, "tasks.shared.segment", lambda s: s + "\nEXTRA = 1\n")
    new_keys, rows = states(built)
    assert changed(keys, new_keys) == set(FROM_SEGMENT)
    assert rows["segment"]["why"] == ["code tasks/shared/segment.py changed"]
    fingerprint._module_info.cache_clear()


def test_an_edited_user_dictionary_rebuilds_segment(built):
    keys, _ = states(built)
    original = built["dict"].read_text(encoding="utf-8")
    try:
        built["dict"].write_text(original + "早餐很好 5 a\n", encoding="utf-8")
        os.utime(built["dict"], ns=(1, 10**18))  # a distinct mtime, as an editor gives
        new_keys, rows = states(built)
    finally:
        built["dict"].write_text(original, encoding="utf-8")
    assert changed(keys, new_keys) == set(FROM_SEGMENT)
    assert rows["segment"]["why"] == [f"file {built['dict']} changed"]


def test_a_library_version_rebuilds_what_it_shapes(built, monkeypatch):
    keys, _ = states(built)
    real = planner.library_versions
    monkeypatch.setattr(
        planner,
        "library_versions",
        lambda names: {**real(names), **({"jieba": "0.43.0"} if "jieba" in names else {})},
    )
    new_keys, rows = states(built)
    # jieba shapes segment; the rest follow from it
    assert changed(keys, new_keys) == set(FROM_SEGMENT)
    assert rows["segment"]["why"] == ["library jieba 0.42.1 -> 0.43.0"]


def test_a_model_unit_sees_its_own_familys_libraries_only(monkeypatch):
    """A family's libraries are declared once, on its ModelSpec: a new scipy (TF-IDF's sparse
    matrices) rebuilds tfidf_lr and the stages that gather it, no other model."""
    config = load_pipeline("chnsenticorp")
    causes = planner.plan(config)
    real = planner.library_versions
    monkeypatch.setattr(
        planner,
        "library_versions",
        lambda names: {**real(names), **({"scipy": "99.0"} if "scipy" in names else {})},
    )
    new = planner.plan(config)
    keys = {u: stage_key(c) for u, c in causes.items()}
    assert changed(keys, {u: stage_key(c) for u, c in new.items()}) == {
        "train.tfidf_lr",
        "evaluate.tfidf_lr",
        "train",
        "evaluate",
    }
    assert "scipy" not in causes["train.fasttext"]["libraries"]
    why = diff_causes("train.tfidf_lr", causes["train.tfidf_lr"], new["train.tfidf_lr"])
    assert why == [f"library scipy {causes['train.tfidf_lr']['libraries']['scipy']} -> 99.0"]


def test_an_augmenter_s_key_holds_the_settings_and_libraries_of_its_method_only(monkeypatch):
    """A new PyTorch (back-translation's MarianMT) rebuilds an EDA pipeline's stages only where a
    model trains with it, never augment and the data stages after it, and neither do the
    back-translation settings; a back-translating pipeline's augment sees both."""
    from flows.plan.request import RunRequest

    eda = load_pipeline("chnsenticorp")
    assert eda.section("augment").method == "eda"
    translating = RunRequest("chnsenticorp", ("augment.method=backtranslation",)).config()
    causes = {"eda": planner.plan(eda), "bt": planner.plan(translating)}
    real = planner.library_versions
    monkeypatch.setattr(
        planner,
        "library_versions",
        lambda names: {**real(names), **({"torch": "99.0"} if "torch" in names else {})},
    )
    new = {"eda": planner.plan(eda), "bt": planner.plan(translating)}
    keys = {
        name: ({u: stage_key(c) for u, c in causes[name].items()}, new[name]) for name in causes
    }
    moved = {
        name: {u.stage for u in changed(old, {u: stage_key(c) for u, c in now.items()})}
        for name, (old, now) in keys.items()
    }
    assert set(causes["eda"]["augment"]["libraries"]) == {"jieba"}
    assert "augment" not in moved["eda"] and "vocab" not in moved["eda"]
    assert {"augment", "vocab", "embed"} <= moved["bt"]
    assert "torch" in causes["bt"]["augment"]["libraries"]
    settings = ("augment.backtranslation.max_rows=7",)
    for name, base in (("eda", ()), ("bt", ("augment.method=backtranslation",))):
        old = planner.unit_params(RunRequest("chnsenticorp", base).config(), "augment")
        new = planner.unit_params(RunRequest("chnsenticorp", base + settings).config(), "augment")
        assert (old == new) == (name == "eda"), name
    assert "backtranslation" not in planner.unit_params(eda, "augment")


def test_status_command_names_the_cause(built, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.setenv("ZHPIPE_STORAGE", str(built["store"].root))
    code = main(
        [
            "status",
            "smoke",
            *sum((["--set", s] for s in built["sets"]), []),
            "--set",
            "clean.min_chars=3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "param clean.min_chars: 2 -> 3" in out and "upstream clean changed" in out


def test_a_hub_model_that_appears_in_the_cache_changes_the_key(monkeypatch, tmp_path):
    """Back-translation names hub models: their cached revision is part of the augment key, so an
    output built while they were missing (an EDA fallback) is not reused once they are there."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    config = load_pipeline("chnsenticorp-bt", overrides=["augment.fallback=eda"])
    before = planner.plan(config)["augment"]
    repo = tmp_path / "models--Helsinki-NLP--opus-mt-zh-en"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    after = planner.plan(config)["augment"]
    assert before["files"]["Helsinki-NLP/opus-mt-zh-en"] == "hub:Helsinki-NLP/opus-mt-zh-en@absent"
    assert after["files"]["Helsinki-NLP/opus-mt-zh-en"] == "hub:Helsinki-NLP/opus-mt-zh-en@abc123"
    assert stage_key(before) != stage_key(after)
    assert diff_causes("augment", before, after) == ["file Helsinki-NLP/opus-mt-zh-en changed"]


def test_adding_a_model_trains_only_the_new_one(built):
    keys, _ = states(built)
    new_keys, _ = states(built, ["train.models=[fasttext, textcnn, tfidf_lr]"])
    assert set(new_keys) - set(keys) == {"train.tfidf_lr", "evaluate.tfidf_lr"}
    # the existing units keep their keys
    assert changed(keys, {k: new_keys[k] for k in keys}) == {"train", "evaluate"}


def test_a_setting_that_names_a_huge_folder_or_a_dangling_link_is_one_clear_error(
    tmp_path, monkeypatch
):
    """segment.user_dict=/usr would walk and hash a whole tree into a key; a dangling link gave a
    traceback."""
    from flows.plan import fingerprint
    from flows.plan.fingerprint import file_fingerprints
    from tasks.errors import ConfigError

    monkeypatch.setattr(fingerprint, "MAX_FOLDER_FILES", 50)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(51):
        (big / f"{i}.txt").write_text("x")
    with pytest.raises(
        ConfigError, match="segment.user_dict: .* is a folder of more than 50 files"
    ):
        file_fingerprints({"user_dict": str(big)}, ("user_dict",), tmp_path, section="segment")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is a symbolic link to nothing"):
        file_fingerprints({"user_dict": str(tmp_path / "gone")}, ("user_dict",), tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "stale").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="holds a symbolic link to nothing"):
        file_fingerprints({"checkpoint": str(model)}, ("checkpoint",), tmp_path)


@pytest.mark.parametrize(
    "pipeline, setting, unknown, allowed",
    [
        # Word2Vec only
        ("resume-ner", "embed.fasttext.epoch=3", "stages.embed.fasttext", "word2vec, probe_words"),
        (
            "resume-ner",
            "clean.strip_html=false",
            "stages.clean.strip_html",
            "nfkc, traditional_to_simplified",
        ),  # per character
        ("resume-ner", "profile.cloud_words=20", "stages.profile.cloud_words", "top_k, coverage"),
        # no embed stage
        ("tatoeba-zh-en", "embed.fasttext.epoch=3", "stages.embed", "download, clean, split"),
        ("tatoeba-zh-en", "profile.max_labels=3", "stages.profile.max_labels", "top_k, coverage"),
    ],
)
def test_a_setting_a_kind_does_not_read_is_refused_in_one_line(pipeline, setting, unknown, allowed):
    """A kind's sections hold only what its stages read: another kind's setting is an error naming
    the allowed keys, never a silent change of keys."""
    from tasks.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_pipeline(pipeline, overrides=[setting])
    message = str(e.value)
    assert "\n" not in message and f"unknown key '{unknown}'" in message and allowed in message


def test_a_setting_a_kind_reads_changes_its_keys_and_no_others():
    base = {s: stage_key(c) for s, c in planner.plan(load_pipeline("resume-ner")).items()}
    moved = {
        s: stage_key(c)
        for s, c in planner.plan(load_pipeline("resume-ner", overrides=["profile.top_k=7"])).items()
    }
    assert changed(base, moved) == {"profile"}


def test_settings_that_spread_the_work_leave_every_key_unchanged():
    """clean.workers, segment.workers and segment.chunk_rows change how the work is spread, and
    download's timeout_s, deadline_s, retries and retry_delay_s how long a fetch waits and how often
    it is tried again, never what is written; translation's clean has no workers (it is not
    chunked): refused in one line. A size limit of the download does change its key."""
    from tasks.errors import ConfigError

    base = planner.plan_keys(load_pipeline("chnsenticorp"))
    spread = planner.plan_keys(
        load_pipeline(
            "chnsenticorp",
            overrides=[
                "clean.workers=3",
                "segment.workers=2",
                "segment.chunk_rows=50",
                "download.retry_delay_s=0.1",
            ],
        )
    )
    assert spread == base
    transport = [
        "download.retry_delay_s=5",
        "download.timeout_s=5",
        "download.deadline_s=60",
        "download.retries=0",
    ]
    assert planner.plan_keys(
        load_pipeline("tatoeba-zh-en", overrides=transport)
    ) == planner.plan_keys(load_pipeline("tatoeba-zh-en"))
    limited = planner.plan_keys(
        load_pipeline("chnsenticorp", overrides=["download.max_bytes=1000000"])
    )
    assert limited["download"] != base["download"]
    with pytest.raises(ConfigError, match="unknown key 'stages.clean.workers'"):
        load_pipeline("tatoeba-zh-en", overrides=["clean.workers=3"])


def test_a_registered_model_in_a_key_is_asked_of_the_registry_passed_in():
    """A key that names `models:/...` holds the version the registry gives; planning without a
    registry, or a registry that fails, is one line naming the setting or the model (never a key
    built on `@absent`)."""
    from flows.track.champion import revision
    from tasks.errors import ConfigError

    config = load_pipeline("chnsenticorp-bt-local")
    keys = planner.plan(
        config,
        registry=lambda uri: (
            "zhpipe-tatoeba-zh-en/3" if "zh-en" in uri else "zhpipe-tatoeba-en-zh/1"
        ),
    )
    assert (
        keys["augment"]["files"]["models:/zhpipe-tatoeba-zh-en@champion"]
        == "registry:zhpipe-tatoeba-zh-en/3"
    )
    later = planner.plan(
        config,
        registry=lambda uri: (
            "zhpipe-tatoeba-zh-en/4" if "zh-en" in uri else "zhpipe-tatoeba-en-zh/1"
        ),
    )
    assert stage_key(later["augment"]) != stage_key(keys["augment"]) and stage_key(
        later["segment"]
    ) == stage_key(keys["segment"])
    with pytest.raises(
        ConfigError,
        match=r"augment.backtranslation.pivots.*models:/zhpipe-tatoeba-.*is a registered model",
    ) as e:
        planner.plan(config)
    assert "\n" not in str(e.value)
    with pytest.raises(
        ConfigError, match="models:/zhpipe-tatoeba-zh-en@champion: no such registered model version"
    ) as e:
        planner.plan(config, registry=revision)  # this tracking store has no such model
    assert "\n" not in str(e.value)
