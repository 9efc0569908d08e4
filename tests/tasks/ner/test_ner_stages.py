"""The data stages of task ner (tasks/ner/) on their own, as the pipeline chains them: one CoNLL
file with BIO tags and tabs read with its malformed line quarantined, cleaned, and split 80/10/10; a
corpus with its own dev and test files keeps them as they are."""

import unicodedata
from pathlib import Path

import pandas as pd

from tasks.core import BuildContext, established
from tasks.ner import clean, download, split
from tasks.ner.tagging import parse_conll, spans_of
from tasks.source.schema import Source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ner"


class Store:
    def downloads(self, url):
        raise AssertionError("no fetch for a local file")

    def expect(self, source):
        return None


def chain(tmp_path: Path, source: Source, **split_params) -> dict:
    """download -> clean -> split by their builds; each stage's result and folder."""
    out, inputs, facts = {}, {}, {}
    for name, module, params in (
        ("download", download, download.Params()),
        ("clean", clean, clean.Params()),
        ("split", split, split.Params(**split_params)),
    ):
        folder = tmp_path / name
        folder.mkdir()
        result = module.build(
            BuildContext(
                dict(inputs),
                dict(facts),
                folder,
                params,
                scratch=tmp_path / f"{name}-scratch",
                root=tmp_path,
                source=source,
                store=Store(),
            )
        )
        # as the run engine stores them: its own over what it read
        result.facts = established(name, facts, result.facts)
        out[name], inputs, facts = (result, folder), {name: folder}, {name: result.facts}
    return out


def sentences() -> list:
    found = []
    for name in ("train", "dev", "test"):
        found += parse_conll(
            (FIXTURES / f"{name}.bmes").read_text(encoding="utf-8").splitlines()
        ).sentences
    return found


def test_one_bio_file_with_tabs_is_read_and_split_80_10_10(tmp_path):
    """The shape of other corpora: one CoNLL file, BIO tags, tab-separated; a malformed line
    quarantined."""
    lines = []
    every = sentences()
    for s in every:
        bio = ["O"] * len(s.text)
        for kind, start, end in spans_of(s.tags):
            bio[start:end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        lines += [f"{c}\t{t}" for c, t in zip(s.text, bio)] + [""]
    lines[3] = "broken-line-without-a-tag"
    (tmp_path / "corpus.bio").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stages = chain(tmp_path, Source(path="corpus.bio", format="conll"))
    loaded, folder = stages["download"]
    assert loaded.rows == len(every) - 1 and loaded.metrics["rows_quarantined"] == 1
    quarantine = pd.read_parquet(folder / "quarantine.parquet")
    assert quarantine["line"].tolist() == [4] and quarantine["reason"].tolist() == [
        "expected 'token TAG'"
    ]
    assert (
        loaded.facts["tag_scheme"] == {"all": "bio"}
        and "NAME" in loaded.facts.labels
        and loaded.facts["given_splits"] == []
    )
    kept = stages["clean"][0].rows
    result, folder = stages["split"]
    rows = {
        s: len(pd.read_parquet(folder / f"{s}.parquet")) for s in ("train", "validation", "test")
    }
    assert sum(rows.values()) == kept and all(
        abs(rows[s] - kept / 10) <= 1 for s in ("validation", "test")
    )
    assert result.facts.labels == loaded.facts.labels  # the entity types handed on to train


def test_the_corpus_own_dev_and_test_files_are_kept_as_they_are(tmp_path):
    for name in ("train", "dev", "test"):
        (tmp_path / f"{name}.bmes").write_text(
            (FIXTURES / f"{name}.bmes").read_text(encoding="utf-8"), encoding="utf-8"
        )
    source = Source(
        path="train.bmes",
        format="conll",
        splits={"validation": {"path": "dev.bmes"}, "test": {"path": "test.bmes"}},
    )
    stages = chain(tmp_path, source)
    assert stages["download"][0].facts["given_splits"] == ["test", "train", "validation"]
    given = sorted(
        unicodedata.normalize("NFKC", s.text)
        for s in parse_conll(
            (FIXTURES / "test.bmes").read_text(encoding="utf-8").splitlines()
        ).sentences
    )
    assert sorted(pd.read_parquet(stages["split"][1] / "test.parquet")["text"]) == given
    (tmp_path / "cut").mkdir()
    for name in ("train", "dev", "test"):
        (tmp_path / "cut" / f"{name}.bmes").write_bytes((tmp_path / f"{name}.bmes").read_bytes())
    # one corpus, cut by the fractions instead
    cut = chain(tmp_path / "cut", source, use_given=False)
    test = sorted(pd.read_parquet(cut["split"][1] / "test.parquet")["text"])
    assert test != given and abs(len(test) - cut["clean"][0].rows / 10) <= 1
