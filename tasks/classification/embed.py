"""Stage `embed`: gensim Word2Vec and fastText subword vectors trained on the segmented train
corpus, with their probes: nearest neighbours, analogies (a : b :: c : ?) and word-pair
similarities."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from tasks.core import BuildContext, BuildOutput, Section
from tasks.util.text import is_word
from tasks.util.vectors import (
    FASTTEXT_MIN_THREADS,
    Word2VecParams,
    fasttext_call,
    fasttext_dim,
    neighbours,
    train_word2vec,
)

# what its key sees besides params, inputs and code (flows/plan/fingerprint.py): the libraries that
# shape its output, and the params that name files (counted by content)
LIBRARIES = ("gensim", "fasttext", "scikit-learn", "matplotlib", "numpy")
FILES: tuple[str, ...] = ()


class FastTextParams(Section):
    """fastText unsupervised subword vectors."""

    enabled: bool = True
    model: Literal["skipgram", "cbow"] = "skipgram"
    dim: int = 100
    minn: int = 1  # Chinese words are short: subwords of 1-2 characters
    maxn: int = 2
    epoch: int = 5
    lr: float = 0.05  # fastText's default
    bucket: int = 100000  # hashed subword buckets; 2M (fastText's default) makes an 800 MB model

    _dim = field_validator("dim")(fasttext_dim)


class Params(Section):
    """The `embed` section."""

    word2vec: Word2VecParams = Word2VecParams()
    fasttext: FastTextParams = FastTextParams()
    probe_words: list[str] = ["酒店", "服务", "干净"]
    topn: int = 5
    # analogy probes a : b :: c : ?, answered by 3CosAdd (b - a + c); a fourth word is the expected
    # answer
    analogies: list[list[str]] = [["干净", "脏", "好", "差"], ["早餐", "吃", "房间", "住"]]
    similarity_pairs: list[list[str]] = [
        ["干净", "整洁"],
        ["服务", "态度"],
        ["酒店", "宾馆"],
        ["好", "差"],
    ]
    workers: int = Field(2, ge=1)  # gensim threads; >1 trades bit-exact reproducibility for speed
    seed: int = 1
    plot_words: int = Field(150, ge=10)  # the most frequent words drawn in the 2-D projection
    tsne: bool = False  # also a t-SNE projection (slower than PCA)
    projector_words: int = Field(5000, ge=10)  # words exported for the TensorBoard projector


def train_fasttext(corpus: Path, params: Params):
    """fastText unsupervised vectors with character n-gram subwords."""
    import fasttext

    f = params.fasttext
    return fasttext_call(
        lambda: fasttext.train_unsupervised(
            str(corpus),
            model=f.model,
            dim=f.dim,
            minn=f.minn,
            maxn=f.maxn,
            epoch=f.epoch,
            lr=f.lr,
            bucket=f.bucket,
            thread=max(params.workers, FASTTEXT_MIN_THREADS),
            verbose=0,
        ),
        "embed.fasttext",
        f"lower embed.fasttext.lr (now {f.lr})",
    )


def fasttext_keyed_vectors(model):
    """The fastText model's in-vocabulary vectors as gensim KeyedVectors."""
    from gensim.models import KeyedVectors

    words = model.get_words()
    kv = KeyedVectors(vector_size=model.get_dimension())
    kv.add_vectors(words, [model.get_word_vector(w) for w in words])
    return kv


def analogy_rows(name: str, kv, analogies: list[list[str]], topn: int) -> list[dict]:
    """a : b :: c : ? by 3CosAdd over KeyedVectors, with the rank of the expected answer when given
    (None when it is not in the top `topn`, or a word is out of the vocabulary)."""
    rows = []
    for item in analogies:
        a, b, c, *expected = item
        missing = [w for w in (a, b, c, *expected) if w not in kv.key_to_index]
        answers = [] if missing else kv.most_similar(positive=[b, c], negative=[a], topn=topn)
        words = [w for w, _ in answers]
        rows.append(
            {
                "model": name,
                "analogy": f"{a} : {b} :: {c} : ?",
                "expected": expected[0] if expected else "",
                "answers": " ".join(words),
                "top1_cosine": round(float(answers[0][1]), 4) if answers else None,
                "expected_rank": words.index(expected[0]) + 1
                if expected and expected[0] in words
                else None,
                "missing": " ".join(missing),
            }
        )
    return rows


def similarity_rows(name: str, kv, pairs: list[list[str]]) -> list[dict]:
    """Cosine similarity of word pairs (None when a word is out of the vocabulary)."""
    return [
        {
            "model": name,
            "word": a,
            "other": b,
            "cosine": round(float(kv.similarity(a, b)), 4)
            if a in kv.key_to_index and b in kv.key_to_index
            else None,
        }
        for a, b, *_ in pairs
    ]


def frequent_words(kv, n: int) -> list[str]:
    """The `n` most frequent real words of a KeyedVectors (gensim keeps them by frequency), no
    punctuation."""
    return [w for w in kv.index_to_key if is_word(w)][:n]


def pca_2d(x: np.ndarray) -> np.ndarray:
    """The rows of `x` on their first two principal components: an SVD of the centred rows, each
    component's sign fixed so its largest loading is positive (as scikit-learn's PCA does), so the
    picture is stable. numpy alone: the embed stage does not import scikit-learn for 150 points."""
    centred = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    components = (
        vt[:2] * np.sign(vt[:2][np.arange(min(2, len(vt))), np.abs(vt[:2]).argmax(axis=1)])[:, None]
    )
    xy = np.zeros((len(x), 2), dtype=np.float64)
    # one word has one component; the other axis stays 0
    xy[:, : len(components)] = centred @ components.T
    return xy


def plot_projection(kv, words: list[str], method: str, path: Path, font: str, seed: int) -> Path:
    """The words' vectors projected to 2-D (PCA or t-SNE), each point labelled with its word."""
    from tasks.util.plots import save, subplots, use_font

    use_font(font)
    x = np.stack([kv[w] for w in words])
    if method == "pca":
        xy = pca_2d(x)
    else:
        from sklearn.manifold import TSNE

        xy = TSNE(
            n_components=2, perplexity=min(30, len(words) - 1), init="pca", random_state=seed
        ).fit_transform(x)
    fig, ax = subplots(figsize=(10, 8))
    ax.scatter(xy[:, 0], xy[:, 1], s=6, alpha=0.5)
    for (a, b), word in zip(xy, words):
        ax.annotate(word, (a, b), fontsize=7, alpha=0.85)
    ax.set(
        title=f"{len(words)} most frequent words, Word2Vec, {method.upper()}", xticks=[], yticks=[]
    )
    return save(fig, path)


def format_rows(vectors: np.ndarray) -> list[str]:
    """Each row as space-separated numbers, six significant digits (numpy's formatting, not repr per
    float)."""
    import io

    buf = io.StringIO()
    np.savetxt(buf, vectors, fmt="%.6g", delimiter=" ")
    return buf.getvalue().split("\n")[: len(vectors)]


def save_text_vectors(kv, path: Path) -> None:
    """word2vec's text format (a header, then `word v1 v2 ...`), for people and other tools; the
    binary file keeps the exact values. Several times faster than gensim's writer, which formats
    each float with repr."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{len(kv)} {kv.vector_size}\n")
        f.writelines(f"{w} {row}\n" for w, row in zip(kv.index_to_key, format_rows(kv.vectors)))


def export_projector(kv, words: list[str], folder: Path, name: str = "word2vec") -> Path:
    """vectors.tsv + metadata.tsv + projector_config.pbtxt: `tensorboard --logdir <folder>` shows
    them in its Projector tab (or load the two TSV files at projector.tensorflow.org)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = format_rows(np.stack([kv[w] for w in words])) if words else []
    (folder / "vectors.tsv").write_text(
        "".join(row.replace(" ", "\t") + "\n" for row in rows), encoding="utf-8"
    )
    (folder / "metadata.tsv").write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    (folder / "projector_config.pbtxt").write_text(
        f'embeddings {{\n  tensor_name: "{name}"\n  tensor_path: "vectors.tsv"\n  metadata_path: '
        f'"metadata.tsv"\n}}\n',
        encoding="utf-8",
    )
    return folder


def build(ctx: BuildContext) -> BuildOutput:
    """Write `word2vec.bin` + `word2vec.txt`, `fasttext.bin` + `fasttext.vec`, `neighbours.csv`
    (formats that load without pickle: word2vec's own binary and text formats, fastText's native
    model)."""
    p: Params = ctx.params
    corpus = ctx.file("augment", "train.words.txt")
    w2v = train_word2vec(corpus, p)
    w2v.save_word2vec_format(str(ctx.out / "word2vec.bin"), binary=True)
    save_text_vectors(w2v, ctx.out / "word2vec.txt")
    rows = neighbours(
        "word2vec",
        p.probe_words,
        lambda w, n: w2v.most_similar(w, topn=n) if w in w2v else [],
        p.topn,
    )
    metrics = {"word2vec_vocab": len(w2v)}
    artifacts = ["word2vec.txt", "neighbours.csv"]
    if p.fasttext.enabled:
        ft = train_fasttext(corpus, p)
        ft.save_model(str(ctx.out / "fasttext.bin"))
        ft_kv = fasttext_keyed_vectors(ft)
        save_text_vectors(ft_kv, ctx.out / "fasttext.vec")
        # fastText answers for unseen words too, through their subwords
        rows += neighbours(
            "fasttext",
            p.probe_words,
            lambda w, n: [(o, s) for s, o in ft.get_nearest_neighbors(w, k=n)],
            p.topn,
        )
        metrics["fasttext_vocab"] = len(ft.get_words())
        artifacts.append("fasttext.vec")
    from tasks.util.plots import require_cjk_font

    font = require_cjk_font(what="embed")  # the words are drawn: never as boxes
    plot_projection(
        w2v, frequent_words(w2v, p.plot_words), "pca", ctx.out / "word2vec_pca.png", font, p.seed
    )
    artifacts.append("word2vec_pca.png")
    if p.tsne:
        plot_projection(
            w2v,
            frequent_words(w2v, p.plot_words),
            "tsne",
            ctx.out / "word2vec_tsne.png",
            font,
            p.seed,
        )
        artifacts.append("word2vec_tsne.png")
    export_projector(w2v, frequent_words(w2v, p.projector_words), ctx.out / "projector")
    artifacts.append("projector")
    table = pd.DataFrame(rows, columns=["model", "word", "rank", "neighbour", "cosine"])
    table.to_csv(ctx.out / "neighbours.csv", index=False)
    # fastText answers for words it never saw, from their subwords
    vector_sets = {"word2vec": w2v, **({"fasttext": ft_kv} if p.fasttext.enabled else {})}
    probes = {
        "analogies": pd.DataFrame(
            [r for n, kv in vector_sets.items() for r in analogy_rows(n, kv, p.analogies, p.topn)]
        ),
        "similarities": pd.DataFrame(
            [r for n, kv in vector_sets.items() for r in similarity_rows(n, kv, p.similarity_pairs)]
        ),
    }
    for name, frame in probes.items():
        frame.to_csv(ctx.out / f"{name}.csv", index=False)
        artifacts.append(f"{name}.csv")
    answered = (
        probes["analogies"].loc[probes["analogies"]["model"] == "word2vec", "expected_rank"]
        if len(probes["analogies"])
        else pd.Series(dtype=float)
    )
    if len(answered):
        metrics["word2vec_analogy_top5"] = float(answered.notna().mean())
    return BuildOutput(
        rows=len(w2v),
        metrics=metrics,
        artifacts=artifacts,
        tables={
            f"{name}.json": frame
            for name, frame in {"neighbours": table, **probes}.items()
            if len(frame)
        },
    )
