"""Stage `embed`: gensim Word2Vec and fastText subword vectors trained on the segmented train corpus."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from tqdm.auto import tqdm
from prefect import task
from prefect.cache_policies import NO_CACHE

from flows.config import EmbedConfig
from flows.errors import DataError
from flows.runner import BuildContext, BuildOutput, RunContext, StageResult

VERSION = "1"


def train_word2vec(corpus: Path, params: EmbedConfig):
    """Word2Vec (CBOW or skip-gram; negative sampling or hierarchical softmax) from a token-per-space file."""
    from gensim.models import Word2Vec
    from gensim.models.callbacks import CallbackAny2Vec

    class Progress(CallbackAny2Vec):
        def __init__(self, bar):
            self.bar = bar

        def on_epoch_end(self, model):
            self.bar.update(1)

    w = params.word2vec
    logging.getLogger("gensim").setLevel(logging.WARNING)
    with tqdm(total=w.epochs, desc="word2vec", unit="epoch", leave=False) as bar:
        model = Word2Vec(
            corpus_file=str(corpus), vector_size=w.vector_size, window=w.window, min_count=w.min_count,
            sg=int(w.sg), hs=int(w.hs), negative=0 if w.hs else w.negative, epochs=w.epochs,
            workers=params.workers, seed=params.seed, callbacks=[Progress(bar)],
        )
    return model.wv


# fastText 0.9.3 initialises its input matrix in 10 fixed blocks, one per training thread, over memory it
# does not zero: with fewer than 10 threads most rows stay uninitialised (garbage, at times NaN, so
# training stops with "Encountered NaN." or learns from noise), and with dim not a multiple of 10 the last
# few values do. So it always gets at least 10 threads, and configs require dim % 10 == 0.
FASTTEXT_MIN_THREADS = 10


def fasttext_call(train: Callable, what: str, hint: str):
    """Call a fastText training function; its divergence error becomes one clear line."""
    try:
        return train()
    except RuntimeError as e:
        raise DataError(f"{what}: training diverged ({e}); {hint}") from e


def train_fasttext(corpus: Path, params: EmbedConfig):
    """fastText unsupervised vectors with character n-gram subwords."""
    import fasttext

    f = params.fasttext
    return fasttext_call(
        lambda: fasttext.train_unsupervised(
            str(corpus), model=f.model, dim=f.dim, minn=f.minn, maxn=f.maxn, epoch=f.epoch, lr=f.lr,
            bucket=f.bucket, thread=max(params.workers, FASTTEXT_MIN_THREADS), verbose=0,
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


@dataclass
class WordVectors:
    """Pretrained vectors for the networks' embedding layers: `get(token)` is a vector, or None when unknown."""

    name: str
    dim: int
    get: Callable[[str], np.ndarray | None]


def keyed_word_vectors(kv, name: str = "word2vec") -> WordVectors:
    """WordVectors over gensim KeyedVectors (in-vocabulary words only)."""
    return WordVectors(name, kv.vector_size, lambda token: kv[token] if token in kv.key_to_index else None)


def load_word_vectors(folder: Path, name: str) -> WordVectors:
    """The embed stage's `word2vec` vectors, or its `fasttext` model, which builds a vector for any token
    from its character n-grams (subwords), so no vocabulary word is left without one."""
    if name == "word2vec":
        from gensim.models import KeyedVectors

        return keyed_word_vectors(KeyedVectors.load(str(folder / "word2vec.kv")))
    if not (folder / "fasttext.bin").is_file():
        raise DataError("train.embeddings is fasttext, but the embed stage trained no fastText model (embed.fasttext.enabled is false)")
    import fasttext

    model = fasttext.load_model(str(folder / "fasttext.bin"))
    return WordVectors("fasttext", model.get_dimension(), model.get_word_vector)


def neighbours(name: str, probe: list[str], lookup, topn: int) -> list[dict]:
    """Rows of (model, probe word, rank, neighbour, cosine) for a nearest-neighbour table."""
    rows = []
    for word in probe:
        for rank, (other, score) in enumerate(lookup(word, topn), 1):
            rows.append({"model": name, "word": word, "rank": rank, "neighbour": other, "cosine": round(float(score), 4)})
    return rows


def frequent_words(kv, n: int) -> list[str]:
    """The `n` most frequent real words of a KeyedVectors (gensim keeps them by frequency), no punctuation."""
    from tasks.profile import is_word

    return [w for w in kv.index_to_key if is_word(w)][:n]


def plot_projection(kv, words: list[str], method: str, path: Path, font: str, seed: int) -> Path:
    """The words' vectors projected to 2-D (PCA or t-SNE), each point labelled with its word."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    from tasks.plots import plt, save, use_font

    use_font(font)
    x = np.stack([kv[w] for w in words])
    if method == "pca":
        xy = PCA(n_components=2, random_state=seed).fit_transform(x)
    else:
        xy = TSNE(n_components=2, perplexity=min(30, len(words) - 1), init="pca", random_state=seed).fit_transform(x)
    fig, ax = plt.subplots(figsize=(10, 8))
    ax.scatter(xy[:, 0], xy[:, 1], s=6, alpha=0.5)
    for (a, b), word in zip(xy, words):
        ax.annotate(word, (a, b), fontsize=7, alpha=0.85)
    ax.set(title=f"{len(words)} most frequent words, Word2Vec, {method.upper()}", xticks=[], yticks=[])
    return save(fig, path)


def export_projector(kv, words: list[str], folder: Path, name: str = "word2vec") -> Path:
    """vectors.tsv + metadata.tsv + projector_config.pbtxt: `tensorboard --logdir <folder>` shows them in its
    Projector tab (or load the two TSV files at projector.tensorflow.org)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "vectors.tsv", "w", encoding="utf-8") as f:
        for w in words:
            f.write("\t".join(f"{v:.5f}" for v in kv[w]) + "\n")
    (folder / "metadata.tsv").write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    (folder / "projector_config.pbtxt").write_text(
        f'embeddings {{\n  tensor_name: "{name}"\n  tensor_path: "vectors.tsv"\n  metadata_path: "metadata.tsv"\n}}\n', encoding="utf-8")
    return folder


def build(ctx: BuildContext) -> BuildOutput:
    """Write `word2vec.kv` + `word2vec.txt`, `fasttext.bin` + `fasttext.kv` + `fasttext.vec`, `neighbours.csv`."""
    p: EmbedConfig = ctx.params
    corpus = ctx.inputs["augment"] / "train.words.txt"
    w2v = train_word2vec(corpus, p)
    w2v.save(str(ctx.out / "word2vec.kv"))
    w2v.save_word2vec_format(str(ctx.out / "word2vec.txt"), binary=False)
    rows = neighbours("word2vec", p.probe_words, lambda w, n: w2v.most_similar(w, topn=n) if w in w2v else [], p.topn)
    metrics = {"word2vec_vocab": len(w2v)}
    artifacts = ["word2vec.txt", "neighbours.csv"]
    if p.fasttext.enabled:
        ft = train_fasttext(corpus, p)
        ft.save_model(str(ctx.out / "fasttext.bin"))
        ft_kv = fasttext_keyed_vectors(ft)
        ft_kv.save(str(ctx.out / "fasttext.kv"))
        ft_kv.save_word2vec_format(str(ctx.out / "fasttext.vec"), binary=False)
        # fastText answers for unseen words too, through their subwords
        rows += neighbours("fasttext", p.probe_words, lambda w, n: [(o, s) for s, o in ft.get_nearest_neighbors(w, k=n)], p.topn)
        metrics["fasttext_vocab"] = len(ft.get_words())
        artifacts.append("fasttext.vec")
    from tasks.plots import require_cjk_font

    font = require_cjk_font(what="embed")  # the words are drawn: never as boxes
    plot_projection(w2v, frequent_words(w2v, p.plot_words), "pca", ctx.out / "word2vec_pca.png", font, p.seed)
    artifacts.append("word2vec_pca.png")
    if p.tsne:
        plot_projection(w2v, frequent_words(w2v, p.plot_words), "tsne", ctx.out / "word2vec_tsne.png", font, p.seed)
        artifacts.append("word2vec_tsne.png")
    export_projector(w2v, frequent_words(w2v, p.projector_words), ctx.out / "projector")
    artifacts.append("projector")
    table = pd.DataFrame(rows, columns=["model", "word", "rank", "neighbour", "cosine"])
    table.to_csv(ctx.out / "neighbours.csv", index=False)
    if len(table):
        ctx.tracker.table(table, "neighbours.json")
    return BuildOutput(rows=len(w2v), metrics=metrics, info=dict(ctx.input_info["augment"]), artifacts=artifacts)


@task(name="embed", cache_policy=NO_CACHE)
def embed(run: RunContext, augment: StageResult) -> StageResult:
    """Word2Vec and fastText embeddings of the train corpus."""
    return run.run("embed", {"augment": augment}, build)
