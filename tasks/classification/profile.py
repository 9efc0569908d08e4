"""Stage `profile`: what the corpus looks like (the course's text-analysis chapter) as pictures,
tables and one self-contained HTML report: labels per split, text lengths per label, frequent words
and adjectives per label, a word cloud and an adjective cloud per label, vocabulary size, type/token
ratio and the length that covers 90% of texts (a suggested `max_len`)."""

from __future__ import annotations

import json
from collections import Counter
from itertools import chain
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from tasks.core import BuildContext, BuildOutput, Facts
from tasks.shared.reports import Common, report_html, stats_markdown
from tasks.util.io import SPLITS, Rows, safe_name
from tasks.util.text import FUNCTION_WORDS, is_word

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("jieba", "matplotlib", "wordcloud", "numpy")
FILES: tuple[str, ...] = ("font",)


class Params(Common):
    """The `profile` section."""

    cloud_words: int = Field(150, ge=10)  # words in each word cloud
    # labels drawn one by one (the most frequent); all are counted in the tables
    max_labels: int = Field(20, ge=1)


PICTURES = [
    "label_distribution.png",
    "length_distribution.png",
    "length_scatter.png",
    "top_words.png",
    "top_adjectives.png",
]


def hist_quantile(counts: np.ndarray, q: float) -> float:
    """`np.quantile` (linear) of the values 0, 1, 2, ... seen `counts[v]` times, from the counts
    alone."""
    n = int(counts.sum())
    cumulative = np.cumsum(counts)
    h = (n - 1) * q
    lo = int(np.floor(h))
    at = lambda i: float(np.searchsorted(cumulative, i + 1))  # the i-th smallest value
    return at(lo) + (h - lo) * (at(min(lo + 1, n - 1)) - at(lo))


class Profile:
    """What the stage counts, batch by batch (memory: the counts, a bounded sample per label, not
    the corpus): labels per split, text lengths per label (histograms), train tokens per label, and
    from them the words and adjectives worth showing."""

    def __init__(self, seed: int, tags: dict | None, sample_size: int = 3000):
        # jieba's dictionary tags; None: the split's own `pos` column (segment.pos: true)
        self.tags = tags
        self.per_split: dict[str, Counter] = {}
        self.chars: dict = {}  # label -> histogram of text lengths in characters
        self.words_hist = np.zeros(1, dtype=np.int64)
        self.tokens: dict = {}  # label -> every train token's count
        self.tagged: dict = {}  # label -> (shown words, adjectives) from the `pos` column
        # label -> (keys, chars, words) of the rows with the smallest random keys
        self.samples: dict = {}
        self.rng, self.sample_size, self.rows = np.random.default_rng(seed), sample_size, 0

    def add(self, split: str, batch: pd.DataFrame) -> None:
        self.rows += len(batch)
        self.per_split.setdefault(split, Counter()).update(batch["label"].value_counts().to_dict())
        chars = batch["text"].str.len().to_numpy(dtype=np.int64)
        # one row's tokens at a time
        words = np.fromiter((len(w.split()) for w in batch["words"]), np.int64, len(batch))
        self.words_hist = _sum(self.words_hist, np.bincount(words))
        keys = self.rng.random(len(batch))
        for label, rows in batch.groupby("label", sort=False).indices.items():
            self.chars[label] = _sum(
                self.chars.get(label, np.zeros(1, dtype=np.int64)), np.bincount(chars[rows])
            )
            old = self.samples.get(
                label, (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
            )
            k, c, w = (np.concatenate([o, n[rows]]) for o, n in zip(old, (keys, chars, words)))
            keep = np.argsort(k, kind="stable")[: self.sample_size]
            self.samples[label] = (k[keep], c[keep], w[keep])
        if split != "train":
            return
        for label, part in batch.groupby("label", sort=False):
            # at C speed
            self.tokens.setdefault(label, Counter()).update(
                chain.from_iterable(t.split() for t in part["words"])
            )
            if self.tags is None:  # segment stored jieba.posseg's own tags
                found, adjectives = tagged_counts(part["pos"])
                shown_words, shown_adjectives = self.tagged.setdefault(
                    label, (Counter(), Counter())
                )
                shown_words.update(found)
                shown_adjectives.update(adjectives)

    def words(self, label) -> tuple[Counter, Counter]:
        """A label's train words worth showing and its adjectives (jieba POS a/ad/an), with their
        counts."""
        if self.tags is None:
            return self.tagged.get(label, (Counter(), Counter()))
        counts = shown(self.tokens.get(label, Counter()))
        return counts, adjective_counts(counts, self.tags)

    def all_chars(self) -> np.ndarray:
        """The histogram of every text's length in characters."""
        every = np.zeros(1, dtype=np.int64)
        for hist in self.chars.values():
            every = _sum(every, hist)
        return every

    def stats(self, coverage: float) -> dict[str, float]:
        """Vocabulary size, tokens, type/token ratio (train), and the lengths that cover `coverage`
        of all texts."""
        chars = self.all_chars()
        types = set().union(*self.tokens.values())
        tokens = sum(sum(c.values()) for c in self.tokens.values())
        return {
            "vocab_size": len(types),
            "tokens": tokens,
            "type_token_ratio": len(types) / max(tokens, 1),
            "chars_p50": hist_quantile(chars, 0.5),
            f"chars_p{round(coverage * 100)}": hist_quantile(chars, coverage),
            f"words_p{round(coverage * 100)}": hist_quantile(self.words_hist, coverage),
            "suggested_max_len_words": int(np.ceil(hist_quantile(self.words_hist, coverage))),
            "suggested_max_len_chars": int(np.ceil(hist_quantile(chars, coverage))),
        }


def _sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two histograms (counts of the values 0, 1, 2, ...) added, the longer one's length kept."""
    out = np.zeros(max(len(a), len(b)), dtype=np.int64)
    out[: len(a)] += a
    out[: len(b)] += b
    return out


def shown(counts: Counter) -> Counter:
    """The counted words worth showing: no punctuation, no function words (each distinct word
    checked once)."""
    return Counter({w: n for w, n in counts.items() if w not in FUNCTION_WORDS and is_word(w)})


ADJECTIVE_TAGS = ("a", "ad", "an")


def adjective_counts(counts: Counter, tags: dict[str, str]) -> Counter:
    """The adjectives (jieba POS a, ad, an) among counted words, by each word's tag in `tags`."""
    return Counter({w: n for w, n in counts.items() if tags.get(w) in ADJECTIVE_TAGS})


def dictionary_tags() -> dict[str, str]:
    """jieba's dictionary POS tag per word: what jieba.posseg gives every word the dictionary knows
    (the HMM only guesses tags for the rest), so the segment stage's words are tagged without
    cutting again."""
    import jieba.posseg

    from tasks.util.segmenter import _jieba

    _jieba()  # jieba's cache in a folder of our own, before posseg loads the dictionary

    return jieba.posseg.dt.word_tag_tab


def tagged_counts(pos: pd.Series) -> tuple[Counter, Counter]:
    """Word and adjective counts from the segment stage's `word/flag` column (`segment.pos:
    true`)."""
    words, adjectives = Counter(), Counter()
    for line in pos:
        for pair in line.split():
            word, _, flag = pair.rpartition("/")
            words[word] += 1
            if flag in ADJECTIVE_TAGS:
                adjectives[word] += 1
    return shown(words), shown(adjectives)


def plot_labels(per_split: dict[str, Counter], labels: list[str], path: Path) -> Path:
    from tasks.util.plots import save, subplots

    counts = pd.DataFrame(
        {s: pd.Series(c, dtype="int64").reindex(labels, fill_value=0) for s, c in per_split.items()}
    )
    # the category names' room: a CJK character is as wide as two Latin ones; names that would
    # overlap on a wide figure are slanted
    room = sum(
        2 * len(str(x)) if any(ord(ch) > 0x2E80 for ch in str(x)) else len(str(x)) for x in labels
    )
    fig, ax = subplots(figsize=(min(14.0, max(6.0, 0.12 * room + 1.2 * len(labels))), 3.6))
    width = 0.8 / len(counts.columns)
    for i, split in enumerate(counts.columns):
        bars = ax.bar(np.arange(len(labels)) + i * width, counts[split], width, label=split)
        ax.bar_label(bars, fontsize=7)
    ax.set(
        xticks=np.arange(len(labels)) + width * (len(counts.columns) - 1) / 2,
        ylabel="texts",
        title="labels per split",
    )
    slanted = room > 60
    ax.set_xticklabels(labels, rotation=30 if slanted else 0, ha="right" if slanted else "center")
    ax.legend()
    return save(fig, path)


def plot_lengths(profile: Profile, labels: list[str], path: Path) -> Path:
    """Histogram (every text) and density (a Gaussian KDE of a sample of each label) of text length
    in characters."""
    from scipy.stats import gaussian_kde

    from tasks.util.plots import save, subplots

    hi = hist_quantile(profile.all_chars(), 0.99)
    bins = np.linspace(0, hi, 50)
    fig, ax = subplots(figsize=(7, 3.8))
    grid = np.linspace(0, hi, 300)
    for label in labels:
        hist = profile.chars.get(label, np.zeros(1, dtype=np.int64))
        values = np.arange(len(hist))
        n = int(hist.sum())
        line = ax.hist(
            np.minimum(values, hi),
            bins=bins,
            weights=hist,
            alpha=0.35,
            density=True,
            label=f"{label} (n={n})",
        )[2][0]
        x = np.minimum(profile.samples[label][1], hi) if label in profile.samples else np.zeros(0)
        if len(x) > 1 and x.std() > 0:
            ax.plot(
                grid, gaussian_kde(x)(grid), color=line.get_facecolor(), alpha=1.0, linewidth=1.6
            )
    ax.set(
        xlabel="characters (clipped at the 99th percentile)",
        ylabel="density",
        title="text length per label",
    )
    ax.legend()
    return save(fig, path)


def plot_scatter(profile: Profile, labels: list[str], path: Path) -> Path:
    """Characters vs words per text, a point per text of a random sample (at most 3,000 per label),
    by label."""
    from tasks.util.plots import save, subplots

    fig, ax = subplots(figsize=(6, 4))
    for label in labels:
        _, chars, words = profile.samples.get(label, (None, np.zeros(0), np.zeros(0)))
        ax.scatter(chars, words, s=4, alpha=0.4, label=label)
    ax.set(
        xlabel="characters",
        ylabel="words",
        title="text lengths per label",
        xscale="log",
        yscale="log",
    )
    ax.legend(markerscale=4)
    return save(fig, path)


def plot_top(tables: dict[str, list[tuple[str, int]]], title: str, path: Path) -> Path:
    """Horizontal bars of the top words, one panel per label."""
    from tasks.util.plots import save, subplots

    fig, axes = subplots(
        1,
        len(tables),
        figsize=(3.2 * len(tables), 0.25 * max(len(t) for t in tables.values()) + 1.5),
        squeeze=False,
    )
    for ax, (label, rows) in zip(axes[0], tables.items()):
        words, counts = zip(*rows) if rows else ((), ())
        ax.barh(range(len(words)), counts)
        ax.set(yticks=range(len(words)), yticklabels=words, title=f"{label}")
        ax.invert_yaxis()
    fig.suptitle(title)
    return save(fig, path)


def word_cloud(counts: dict[str, int], font: str, path: Path, seed: int = 0) -> Path:
    from wordcloud import WordCloud

    # laid out on a 400x225 canvas and drawn at twice that: the same 800x450 picture in half the
    # time
    cloud = WordCloud(
        font_path=font,
        width=400,
        height=225,
        scale=2,
        background_color="white",
        random_state=seed,
        max_words=len(counts),
        prefer_horizontal=0.95,
    )
    # WordCloud.to_file saves with PNG `optimize`: the same pixels, 3% smaller, in three times the
    # time
    cloud.generate_from_frequencies(counts).to_image().save(path, format="PNG")
    return path


def build(ctx: BuildContext) -> BuildOutput:
    """Pictures, tables and `report.html` about the segmented splits, counted batch by batch."""
    import pyarrow.parquet as pq

    from tasks.util.plots import require_cjk_font, use_font

    p: Params = ctx.params
    # `segment.pos: true`
    pos = ["pos"] if "pos" in pq.read_schema(ctx.file("segment", "train.parquet")).names else []
    font = require_cjk_font(p.font)
    use_font(font)
    profile = Profile(p.seed, None if pos else dictionary_tags())
    for name in SPLITS:
        for batch in Rows(ctx.file("segment", f"{name}.parquet")).batches(
            ["text", "words", "label"] + (pos if name == "train" else [])
        ):
            profile.add(name, batch)
    labels = ctx.facts["segment"].labels or sorted(profile.per_split.get("train", Counter()))
    all_labels = labels
    if len(labels) > p.max_labels:  # 10,000 classes get their counts, not 10,000 pictures
        top = {label for label, _ in profile.per_split["train"].most_common(p.max_labels)}
        labels = [label for label in labels if label in top]
    stats = profile.stats(p.coverage)
    shown_words = {label: profile.words(label) for label in labels}
    clouds = {
        label: dict(found.most_common(p.cloud_words)) for label, (found, _) in shown_words.items()
    }
    adjective_clouds = {
        label: dict(adjectives.most_common(p.cloud_words))
        for label, (_, adjectives) in shown_words.items()
    }
    words = {str(label): list(clouds[label].items())[: p.top_k] for label in labels}
    adjectives = {str(label): list(adjective_clouds[label].items())[: p.top_k] for label in labels}
    pictures = [
        plot_labels(profile.per_split, labels, ctx.out / "label_distribution.png"),
        plot_lengths(profile, labels, ctx.out / "length_distribution.png"),
        plot_scatter(profile, labels, ctx.out / "length_scatter.png"),
        plot_top(
            words,
            f"most frequent words per label (train, top {p.top_k})",
            ctx.out / "top_words.png",
        ),
        plot_top(
            adjectives,
            f"most frequent adjectives per label (train, jieba POS a/ad/an, top {p.top_k})",
            ctx.out / "top_adjectives.png",
        ),
    ]
    for label in labels:
        pictures.append(
            word_cloud(clouds[label], font, ctx.out / f"wordcloud_{safe_name(label)}.png", p.seed)
        )
        if adjective_clouds[label]:  # the course's adjective cloud: jieba POS a/ad/an only
            pictures.append(
                word_cloud(
                    adjective_clouds[label],
                    font,
                    ctx.out / f"adjectives_{safe_name(label)}.png",
                    p.seed,
                )
            )
    tables = {
        "labels per split": pd.DataFrame(
            {
                s: pd.Series(profile.per_split.get(s, Counter()), dtype="int64").reindex(
                    all_labels, fill_value=0
                )
                for s in SPLITS
            }
        )
        .rename_axis("label")
        .reset_index(),
        "top words per label": _side_by_side(words),
        "top adjectives per label": _side_by_side(adjectives),
    }
    for name, table in tables.items():
        table.to_csv(ctx.out / f"{name.replace(' ', '_')}.csv", index=False)
    (ctx.out / "stats.json").write_text(json.dumps(stats, indent=2), encoding="utf-8")
    (ctx.out / "report.html").write_text(
        report_html(f"{ctx.pipeline}: corpus profile", stats, tables, pictures), encoding="utf-8"
    )
    files = (
        [p.name for p in pictures]
        + ["report.html", "stats.json"]
        + [f"{n.replace(' ', '_')}.csv" for n in tables]
    )
    return BuildOutput(
        rows=profile.rows,
        metrics=stats,
        facts=Facts(own={"font": font}),
        artifacts=files,
        markdown={"profile": stats_markdown(ctx.pipeline, stats)},
        records={"top-words": tables["top words per label"].astype(str).to_dict("records")},
    )


def _side_by_side(tables: dict[str, list[tuple[str, int]]]) -> pd.DataFrame:
    """Rank, then `<label>` and `<label> count` columns."""
    k = max((len(rows) for rows in tables.values()), default=0)
    out = {"rank": list(range(1, k + 1))}
    for label, rows in tables.items():
        rows = rows + [("", 0)] * (k - len(rows))
        out[label] = [w for w, _ in rows]
        out[f"{label} count"] = [c for _, c in rows]
    return pd.DataFrame(out)
