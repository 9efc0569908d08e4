"""The profile stage on the smoke corpus: every picture a valid PNG of sensible size, Chinese drawn
with a font that has its glyphs (matplotlib warns on a missing glyph: that warning is an error
here), one HTML page holding everything, and one clear error when no CJK font can be found."""

import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from tasks.classification.profile import Params as ProfileConfig
from tasks.core import BuildContext, Facts
from tasks.errors import DataError
from tasks.shared.segment import Params as SegmentConfig
from tasks.util.plots import PROBE, cjk_font, has_glyphs, require_cjk_font, save, subplots, use_font
from tasks.util.segmenter import Segmenter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
needs_font = pytest.mark.skipif(
    cjk_font() is None, reason="no CJK font installed (make install adds one)"
)


def _segmented(tmp_path: Path) -> Path:
    df = pd.read_csv(FIXTURES / "smoke.csv").rename(columns={"review": "text"}).dropna()
    df["label"] = df["label"].map({0: "差评", 1: "好评"})
    seg = Segmenter(SegmentConfig())
    df["words"] = [" ".join(seg.words(t)) for t in df["text"]]
    folder = tmp_path / "segment"
    folder.mkdir()
    for name, part in zip(
        ("train", "validation", "test"), (df.iloc[:200], df.iloc[200:250], df.iloc[250:])
    ):
        part.to_parquet(folder / f"{name}.parquet", index=False)
    return folder


@needs_font
def test_profile_pictures_and_report(tmp_path):
    from tasks.classification.profile import PICTURES, build

    out = tmp_path / "out"
    out.mkdir()
    ctx = BuildContext(
        inputs={"segment": _segmented(tmp_path)},
        facts={"segment": Facts(labels=["好评", "差评"])},
        out=out,
        scratch=tmp_path,
        params=ProfileConfig(top_k=10),
        pipeline="smoke",
    )
    with warnings.catch_warnings():
        # a tofu box would raise here
        warnings.filterwarnings("error", message=".*[Gg]lyph.*missing")
        result = build(ctx)
    pictures = PICTURES + [
        "wordcloud_好评.png",
        "adjectives_好评.png",
        "wordcloud_差评.png",
        "adjectives_差评.png",
    ]
    for name in pictures:
        with Image.open(out / name) as img:
            img.verify()
        with Image.open(out / name) as img:
            assert (
                img.format == "PNG" and 300 <= img.size[0] <= 4000 and 200 <= img.size[1] <= 4000
            ), (name, img.size)
    report = (out / "report.html").read_text(encoding="utf-8")
    assert report.count("data:image/png;base64,") == len(pictures)
    assert "好评" in report and "suggested_max_len_words" in report
    stats = json.loads((out / "stats.json").read_text())
    assert 0 < stats["type_token_ratio"] < 1 and stats["vocab_size"] > 100
    assert stats["suggested_max_len_words"] >= stats["chars_p50"] / 4
    top = pd.read_csv(out / "top_words_per_label.csv")
    assert list(top.columns) == ["rank", "好评", "好评 count", "差评", "差评 count"]
    assert not top["好评"].isin(["，", "。", "！"]).any()  # punctuation is not a word
    assert set(result.artifacts) >= set(pictures) | {"report.html"}
    # published as a Prefect artifact by flows/
    assert "suggested_max_len_words" in result.markdown["profile"]
    assert result.records["top-words"][0]["rank"] == "1"


@needs_font
def test_chinese_text_is_drawn_with_a_font_that_has_its_glyphs(tmp_path):
    from matplotlib import font_manager

    font = require_cjk_font()
    assert has_glyphs(font, PROBE + "好评差评")
    use_font(font)
    fig, ax = subplots()
    title = ax.set_title("好评 差评 酒店")
    used = font_manager.findfont(title.get_fontproperties(), fallback_to_default=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*[Gg]lyph.*missing")
        save(fig, tmp_path / "t.png")
    assert Path(used).resolve() == Path(font).resolve()


def test_missing_or_latin_only_font_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="no such font file"):
        require_cjk_font(str(tmp_path / "nope.ttf"))
    from matplotlib import font_manager

    latin = font_manager.findfont("DejaVu Sans")
    with pytest.raises(DataError, match="no glyphs for Chinese"):
        require_cjk_font(latin)


def test_adjectives_are_the_words_jieba_posseg_tags_as_adjectives(tmp_path):
    """Counting the segment stage's words by their dictionary tag finds the adjectives jieba.posseg
    finds when it cuts the same texts (HMM off, so every word's tag comes from the dictionary); a
    stored `pos` column (`segment.pos: true`) is read as it is."""
    import jieba.posseg

    from tasks.classification.profile import ADJECTIVE_TAGS, Profile, dictionary_tags, tagged_counts

    train = pd.read_parquet(_segmented(tmp_path) / "train.parquet")
    profile = Profile(0, dictionary_tags())
    profile.add("train", train.assign(label="all"))
    counts, ours = profile.words("all")
    assert "，" not in counts and "的" not in counts and counts.most_common(1)[0][1] > 10
    theirs = Counter(
        w
        for t in train["text"]
        for w, flag in jieba.posseg.cut(t, HMM=False)
        if flag in ADJECTIVE_TAGS
    )
    top = [w for w, _ in ours.most_common(5)]
    assert len(top) == 5 and all(w in theirs for w in top), (top, theirs.most_common(10))
    assert set(ours) <= set(counts)

    pos = pd.Series(["房间 /x 干净/a 的/uj", "服务/vn 很/d 好/a", "好/a ！/x"])
    words, adjectives = tagged_counts(pos)
    assert (
        adjectives == Counter({"好": 2, "干净": 1})
        and words["服务"] == 1
        and "的" not in words
        and "！" not in words
    )


@needs_font
def test_counted_in_small_batches_the_profile_is_the_whole_corpus_profile(tmp_path, monkeypatch):
    import tasks.util.io as io
    from tasks.classification.profile import build, hist_quantile

    seg = _segmented(tmp_path)
    results = {}
    for rows in (50_000, 17):
        monkeypatch.setattr(io, "BATCH_ROWS", rows)
        out = tmp_path / f"out{rows}"
        out.mkdir()
        results[rows] = (
            build(
                BuildContext(
                    inputs={"segment": seg},
                    facts={"segment": Facts(labels=["好评", "差评"])},
                    out=out,
                    scratch=tmp_path,
                    params=ProfileConfig(top_k=10),
                    pipeline="smoke",
                )
            ),
            (out / "top_words_per_label.csv").read_text(encoding="utf-8"),
        )
    (whole, top), (batched, top_batched) = results[50_000], results[17]
    assert batched.metrics == whole.metrics and top_batched == top and batched.rows == whole.rows
    frame = pd.concat(
        pd.read_parquet(seg / f"{s}.parquet") for s in ("train", "validation", "test")
    )
    lengths = frame["text"].str.len().to_numpy()
    # quantiles from histograms are numpy's
    assert whole.metrics["chars_p50"] == float(np.median(lengths))
    assert hist_quantile(np.bincount(lengths), 0.9) == float(np.quantile(lengths, 0.9))
