"""Tag schemes, spans and the readers of tagged corpora (task ner)."""

import json

import pytest
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
from seqeval.scheme import IOBES

from tasks.ner.evaluate import entity_scores, type_confusion
from tasks.ner.tagged import entity_f1
from tasks.ner.tagging import (
    Lexicon,
    bioes,
    detect_scheme,
    parse_conll,
    parse_span_jsonl,
    spans_from,
    spans_of,
)


def test_every_scheme_reads_into_the_same_bioes_tags():
    text = "张三在北京大学工作"
    bio = ["B-PER", "I-PER", "O", "B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "O"]
    bioes_tags = ["B-PER", "E-PER", "O", "B-ORG", "I-ORG", "I-ORG", "E-ORG", "O", "O"]
    bmes = ["B-PER", "E-PER", "O", "B-ORG", "M-ORG", "M-ORG", "E-ORG", "O", "O"]
    expected = [("PER", 0, 2), ("ORG", 3, 7)]
    for tags, scheme in ((bio, "bio"), (bioes_tags, "bioes"), (bmes, "bmes")):
        assert detect_scheme(tags) == scheme
        for sep in (" ", "\t"):
            parsed = parse_conll([f"{c}{sep}{t}" for c, t in zip(text, tags)])
            assert parsed.scheme == scheme and not parsed.bad
            (sentence,) = parsed.sentences
            assert sentence.text == text and spans_of(sentence.tags) == expected
            assert sentence.tags == bioes_tags


def test_single_character_entities_and_iob1_style_bio():
    assert spans_from(["S-NAME", "O", "B-X", "M-X", "E-X"], "bmes") == (
        [("NAME", 0, 1), ("X", 2, 5)],
        None,
    )
    # BIO read leniently: an I- after O starts an entity; a change of type closes one
    assert spans_from(["I-PER", "I-PER", "O", "I-LOC", "I-ORG"], "bio")[0] == [
        ("PER", 0, 2),
        ("LOC", 3, 4),
        ("ORG", 4, 5),
    ]


def test_malformed_lines_and_ill_formed_tags_are_quarantined_with_their_line():
    lines = [
        "张 B-NAME",
        "三 E-NAME",
        "",
        "北 B-ORG",
        "京",
        "大 E-ORG",
        "",
        "李 B-NAME",
        "四 O",
        "",
        "王 S-NAME",
        "五 O",
        "",
    ]
    parsed = parse_conll(lines)
    assert [s.text for s in parsed.sentences] == ["张三", "王五"]
    assert [(b["line"], b["reason"]) for b in parsed.bad] == [
        (5, "expected 'token TAG'"),
        (8, "entity NAME opened at character 1 is not closed before 'O' at character 2"),
    ]
    # a tag that is not of the file's scheme, with its own line
    parsed = parse_conll(["a B-X", "b M-X", "c E-X", "", "d Q-X", ""])
    assert [(b["line"], b["reason"]) for b in parsed.bad] == [(5, "tag 'Q-X' is not a BMES tag")]


def test_multi_character_tokens_give_their_characters_the_entity():
    (sentence,) = parse_conll(["于 B-DATE", "2012 I-DATE", "年 I-DATE", "任 O"]).sentences
    assert sentence.text == "于2012年任" and spans_of(sentence.tags) == [("DATE", 0, 6)]


def test_span_jsonl_in_both_spellings_and_its_errors():
    lines = [
        json.dumps(
            {
                "text": "张三在北京",
                "entities": [{"start": 0, "end": 2, "type": "PER"}, [3, 5, "LOC"]],
            },
            ensure_ascii=False,
        ),
        json.dumps({"text": "abc", "entities": [[0, 9, "X"]]}),
        "{not json",
        json.dumps({"text": "abcd", "spans": [[0, 2, "X"], [1, 3, "Y"]]}),
    ]
    parsed = parse_span_jsonl(lines)
    assert spans_of(parsed.sentences[0].tags) == [("PER", 0, 2), ("LOC", 3, 5)]
    assert [b["line"] for b in parsed.bad] == [2, 3, 4]
    assert "outside the text" in parsed.bad[0]["reason"] and "overlap" in parsed.bad[2]["reason"]


def test_bioes_round_trips_spans():
    spans = [("A", 0, 1), ("B", 2, 5), ("C", 5, 7)]
    assert spans_of(bioes(spans, 8)) == spans


def test_strict_spans_ignore_ill_formed_chunks_as_seqeval_does():
    tags = ["B-X", "I-X", "O", "I-X", "E-X", "B-Y", "E-X", "S-Z"]
    assert spans_of(tags) == [("Z", 7, 8)]


def _random_tags(rng, n):
    return [
        rng.choice(["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B"]) for _ in range(n)
    ]


def test_metrics_equal_seqeval_strict_mode():
    import random

    rng = random.Random(0)
    gold = [bioes([("A", 0, 2), ("B", 3, 4)], 6), *(_random_tags(rng, 7) for _ in range(60))]
    pred = [bioes([("A", 0, 2)], 6), *(_random_tags(rng, 7) for _ in range(60))]
    ours = entity_f1(gold, pred)
    kw = {"mode": "strict", "scheme": IOBES}
    assert ours["f1"] == pytest.approx(f1_score(gold, pred, **kw))
    assert ours["precision"] == pytest.approx(precision_score(gold, pred, **kw))
    assert ours["recall"] == pytest.approx(recall_score(gold, pred, **kw))
    micro, per_type = entity_scores(gold, pred, ["A", "B"])
    report = classification_report(gold, pred, output_dict=True, **kw)
    assert micro["test_f1"] == pytest.approx(report["micro avg"]["f1-score"])
    for row in per_type.itertuples():
        assert (
            row.f1 == pytest.approx(report[row.type]["f1-score"])
            and row.support == report[row.type]["support"]
        )


def test_type_confusion_counts_wrong_types_missed_and_spurious():
    gold = [bioes([("A", 0, 2), ("B", 3, 4)], 6)]
    pred = [bioes([("B", 0, 2), ("A", 4, 6)], 6)]
    table = type_confusion(gold, pred)
    assert (
        table.loc["A", "B"] == 1
        and table.loc["B", "(missed)"] == 1
        and table.loc["(none)", "A"] == 1
    )


def test_lexicon_matches_cover_each_character_longest_first():
    lexicon = Lexicon(["北京", "北京大学", "大学"], max_words=2)
    ids, places = lexicon.match("在北京大学")
    index = {w: i for w, i in lexicon.index.items()}
    assert ids[0].tolist() == [0, 0]  # 在: no word
    # B, B
    assert ids[1].tolist() == [index["北京大学"], index["北京"]] and places[1].tolist() == [1, 1]
    # M, B
    assert ids[3].tolist() == [index["北京大学"], index["大学"]] and places[3].tolist() == [2, 1]
    # E, E
    assert ids[4].tolist() == [index["北京大学"], index["大学"]] and places[4].tolist() == [3, 3]
