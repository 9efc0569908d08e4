"""Cost that grows with the corpus: an edited copy of the source re-segments only its changed rows
(the row cache), and `status` gives a reason for every stage it calls missing."""

import json
from pathlib import Path

import pandas as pd
import pytest

from flows.orchestrate.pipeline import pipeline_flow

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]


def segmented(out) -> dict:
    stage = next(s for s in out["stages"] if s["stage"] == "segment")
    return {k: int(stage["metrics"][k]) for k in ("rows_segmented", "rows_reused")}


def test_an_edited_copy_of_the_source_re_segments_only_its_changed_rows(smoke, tmp_path):
    """A copy of the smoke corpus (the session's smoke run segmented its texts) cuts no row again;
    five rows edited in a copy of that copy are the only rows cut, and the output is the one a cold
    segmenter writes."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    copy = tmp_path / "reviews.csv"
    rows.to_csv(copy, index=False)
    until = ["download", "clean", "split", "segment"]
    first = pipeline_flow(
        "smoke", stages=until, source={"path": str(copy)}, storage=str(smoke["store"])
    )
    total = next(s for s in first["stages"] if s["stage"] == "segment")["rows"]
    assert segmented(first) == {"rows_segmented": 0, "rows_reused": total}, segmented(first)
    edited = rows.copy()
    edited.loc[[3, 50, 120, 200, 299], "review"] += "，补充一句：房间的窗户朝北"
    edited.to_csv(copy, index=False)
    second = pipeline_flow(
        "smoke", stages=until, source={"path": str(copy)}, storage=str(smoke["store"])
    )
    assert segmented(second) == {"rows_segmented": 5, "rows_reused": total - 5}, segmented(second)
    cold = pipeline_flow(
        "smoke",
        stages=["segment"],
        force=["segment"],
        source={"path": str(copy)},
        overrides=["segment.row_cache=false"],
        storage=str(smoke["store"]),
    )
    assert segmented(cold)["rows_reused"] == 0
    folder = {
        name: Path(next(s for s in out["stages"] if s["stage"] == "segment")["path"])
        for name, out in (("cached", second), ("cold", cold))
    }
    for split in ("train", "validation", "test"):
        assert pd.read_parquet(folder["cached"] / f"{split}.parquet").equals(
            pd.read_parquet(folder["cold"] / f"{split}.parquet")
        ), split


def test_status_gives_a_reason_for_every_missing_stage(smoke):
    """Another pipeline over the same file that differs only in its label column: each missing stage
    says how the built one differs; a store that never built a stage says so."""
    from flows.plan.config import load_pipeline
    from flows.plan.keys import plan
    from flows.plan.status import stage_states
    from flows.plan.store import StageStore, stage_key

    config = load_pipeline("smoke", overrides=["source.label_column=stars"])
    causes = plan(config)
    keys = {unit: stage_key(c) for unit, c in causes.items()}
    rows = {
        r["stage"]: r
        for r in stage_states(StageStore(smoke["store"]), causes, keys, "smoke-by-stars")
    }
    missing = [r for r in rows.values() if r["state"] == "missing"]
    assert missing and all(r["why"] and r["why"][0] for r in missing), missing
    assert "label column changed: label -> stars" in rows["download"]["why"][0], rows["download"]
    empty = stage_states(StageStore(smoke["store"] / "nothing-here"), causes, keys, "smoke")
    assert {r["why"][0] for r in empty} == {"never built in this store"}
    assert json.dumps(rows["download"]["why"])  # plain text, as the table and --json show it


def test_a_stage_no_model_of_the_run_reads_is_not_built(smoke, capsys):
    """fastText alone starts from no word vectors: the embed stage is left out of the run, and
    `status` says why."""
    from flows.plan.config import load_pipeline
    from flows.plan.keys import unread
    from tests.helpers.cli import in_process

    # the vectors of settings never built here
    sets = ["train.models=[fasttext]", "embed.word2vec.epochs=3"]
    assert unread(load_pipeline("smoke", overrides=sets), ["augment", "embed", "train"]) == {
        "embed"
    }
    # textcnn reads it
    assert unread(load_pipeline("smoke"), ["augment", "embed", "train"]) == set()
    # asked for: built
    assert unread(load_pipeline("smoke", overrides=sets), ["augment", "embed"]) == set()
    out = pipeline_flow("smoke", overrides=sets, storage=str(smoke["store"]))
    assert "embed" not in [s["stage"] for s in out["stages"]] and "evaluate" in [
        s["stage"] for s in out["stages"]
    ]
    status = in_process(
        capsys,
        "status",
        "smoke",
        "--set",
        sets[0],
        "--set",
        sets[1],
        "--storage",
        str(smoke["store"]),
    )
    line = next(line for line in status.stdout.splitlines() if "embed" in line)
    assert "not needed" in line, status.stdout


def test_a_label_only_change_reuses_vocabularies_and_embeddings_by_content(smoke, tmp_path):
    """Another pipeline over the same file that differs only in its label column rebuilds what
    reads labels (download, clean, split, segment, augment) but reuses the vocabularies and the word
    vectors: vocab reads the words and characters columns of the train and validation splits, embed
    the train split's words (`content=`), and they are the same. Words that differ are counted and
    trained again."""
    rows = pd.read_csv(ROOT / "tests/fixtures/smoke.csv", dtype=str)
    rows["stars"] = rows["label"].map({"1": "好评", "0": "差评"})
    copy = tmp_path / "reviews.csv"
    rows.to_csv(copy, index=False)
    until = ["download", "clean", "split", "segment", "augment", "vocab", "embed"]

    def run(label: str) -> dict:
        out = pipeline_flow(
            "smoke",
            stages=until,
            source={"path": str(copy), "label_column": label},
            storage=str(tmp_path / "store"),
        )
        return {s["stage"]: s for s in out["stages"]}

    first, second = run("label"), run("stars")
    reused = {"vocab": "words/vocab.txt", "embed": "word2vec.bin"}
    assert {s for s, r in second.items() if r["cache"] == "miss"} == set(until) - set(reused)
    for stage, name in reused.items():
        assert second[stage]["cache"] == "hit" and second[stage]["key"] != first[stage]["key"]
        files = [Path(r[stage]["path"]) / name for r in (first, second)]
        assert files[0].samefile(files[1])  # linked, not copied
    # the facts are the new inputs': its labels are this pipeline's
    assert set(second["embed"]["facts"]["labels"]) == {"好评", "差评"}
    rows["review"] = rows["review"] + "，窗户朝北"
    rows.to_csv(copy, index=False)
    third = run("stars")
    assert third["vocab"]["cache"] == "miss"
    assert third["embed"]["cache"] == "miss"
