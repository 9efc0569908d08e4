"""The data stages of task translation on pairs written here: the reader of tab-separated and
JSON-lines pairs (and what it quarantines), cleaning of both sides, and a split that never puts two
translations of one sentence, or the same sentence with other punctuation, on two sides of a split
line."""

import json

import pandas as pd
import pytest

from tasks.source.schema import Source
from tasks.translation import clean, download, split
from tasks.translation.text import pair_key


class Store:
    def downloads(self, url):
        raise AssertionError("no fetch for a local file")

    def expect(self, source):
        return None


def read(tmp_path, name, body, **params):
    from tasks.core import BuildContext

    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ctx = BuildContext(
        {},
        {},
        out,
        download.Params(**params),
        scratch=tmp_path / "scratch",
        root=tmp_path,
        source=Source(path=name),
        store=Store(),
    )
    result = download.build(ctx)
    return (
        result,
        pd.read_parquet(out / "data.parquet"),
        pd.read_parquet(out / "quarantine.parquet"),
    )


def test_tab_separated_pairs_keep_their_credit_and_bad_lines_are_quarantined_with_their_line(
    tmp_path,
):
    body = (
        "\ufeffHi.\t嗨。\tCC-BY #1\nRun.\t跑。\n\nonly one field\nGood night.\t晚安。\tCC-BY #3\n"
    )
    result, data, bad = read(tmp_path, "cmn.txt", body)
    assert data["text"].tolist() == ["嗨。", "跑。", "晚安。"] and data["en"].tolist() == [
        "Hi.",
        "Run.",
        "Good night.",
    ]
    assert data["credit"].tolist()[0] == "CC-BY #1" and pd.isna(data["credit"].iloc[1])
    assert data["line"].tolist() == [1, 2, 5] and data["id"].tolist() == [0, 1, 2]
    assert bad[["line", "reason"]].values.tolist() == [[4, "fields_1_expected_3"]]
    assert result.metrics["rows_quarantined"] == 1


def test_json_lines_with_src_and_tgt_fields(tmp_path):
    lines = [
        json.dumps({"src": "我很好。", "tgt": "I'm fine."}, ensure_ascii=False),
        "[1, 2]",
        "{broken",
        json.dumps({"src": "好"}),
    ]
    _, data, bad = read(
        tmp_path,
        "pairs.jsonl",
        "\n".join(lines) + "\n",
        zh_field="src",
        en_field="tgt",
        credit_field=None,
    )
    assert data[["text", "en"]].values.tolist() == [["我很好。", "I'm fine."]]
    assert bad["reason"].tolist() == [
        "not_an_object",
        "invalid_json: Expecting property name enclosed in double quotes",
        "no_tgt",
    ]


def test_a_file_with_no_readable_pair_is_one_error(tmp_path):
    from tasks.errors import DataError

    with pytest.raises(DataError, match="no readable rows"):
        read(tmp_path, "cmn.txt", "one field only\n")


def test_clean_normalises_both_sides_and_says_why_a_pair_is_dropped():
    df = pd.DataFrame(
        {
            "id": range(6),
            "text": ["你好！", "你好!", "", "很長的句子。", "好", "今天天气很好。"],
            "en": [
                "Ｈｉ!",
                "Hi!",
                "Empty.",
                "A long sentence.",
                "This English side is far too long for one character.",
                "  ",
            ],
        }
    )
    kept, dropped = clean.clean_pairs(df, clean.Params(traditional_to_simplified=True))
    assert kept[["text", "en"]].values.tolist() == [
        ["你好!", "Hi!"],
        ["很长的句子。", "A long sentence."],
    ]
    assert dict(zip(dropped["id"], dropped["reason"])) == {
        1: "duplicate",
        2: "empty",
        4: "length_ratio",
        5: "en_empty",
    }


def test_translations_of_one_sentence_and_punctuation_variants_share_a_split():
    rows = []
    for i in range(300):
        rows += [
            (f"句子{i}。", f"Sentence {i}."),
            (f"句子{i}！", f"sentence {i}!"),
            (f"另一个{i}。", f"Sentence {i}."),
        ]
    df = pd.DataFrame(rows, columns=["text", "en"]).assign(id=range(len(rows)))
    parts, groups = split.split_pairs(df, split.Params())
    assert groups == 300 and sum(map(len, parts.values())) == len(df)
    for side in ("text", "en"):
        keys = {name: set(part[side].map(pair_key)) for name, part in parts.items()}
        assert (
            not keys["train"] & keys["test"]
            and not keys["train"] & keys["validation"]
            and not keys["validation"] & keys["test"]
        )
    assert 0.7 < len(parts["train"]) / len(df) < 0.9


def test_a_grown_corpus_keeps_every_earlier_pair_in_its_split():
    df = pd.DataFrame(
        {
            "text": [f"第{i}句。" for i in range(400)],
            "en": [f"Line {i}." for i in range(400)],
            "id": range(400),
        }
    )
    before, _ = split.split_pairs(df.head(300), split.Params())
    after, _ = split.split_pairs(df, split.Params())
    for name in before:
        assert set(before[name]["id"]) <= set(after[name]["id"])
