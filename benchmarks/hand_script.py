"""The script a student writes by hand for the bundled corpus: read the CSV, NFKC, dedupe,
stratified split, jieba, Word2Vec (100d x 5 epochs), fastText vectors (100d x 5 epochs), a fastText
classifier and TF-IDF + logistic regression, test accuracy. Serial, no caching, no tracking. Its
settings are zhpipe's defaults for the same steps, so that benchmarks/bench_cold.py compares the
same work.

    python benchmarks/hand_script.py [--csv data/raw/ChnSentiCorp_htl_all.csv] [--json times.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv", default=str(ROOT / "data" / "raw" / "ChnSentiCorp_htl_all.csv"))
    parser.add_argument("--json", help="write the step times here")
    args = parser.parse_args()
    times: dict[str, float] = {}
    t = time.perf_counter()

    def step(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = now - t
        t = now

    import jieba
    import numpy as np
    import pandas as pd

    df = pd.read_csv(args.csv, dtype=str, keep_default_na=False)
    df["text"] = [" ".join(unicodedata.normalize("NFKC", s).split()) for s in df["review"]]
    df = df[df["text"].str.len() >= 2].drop_duplicates(["text", "label"]).reset_index(drop=True)
    step("read_clean")

    rng = np.random.default_rng(42)
    parts = {"train": [], "validation": [], "test": []}
    for _, g in df.groupby("label"):
        order = rng.permutation(len(g))
        n_val, n_test = round(len(g) * 0.1), round(len(g) * 0.1)
        parts["validation"].append(g.iloc[order[:n_val]])
        parts["test"].append(g.iloc[order[n_val : n_val + n_test]])
        parts["train"].append(g.iloc[order[n_val + n_test :]])
    train, validation, test = (pd.concat(parts[k]) for k in ("train", "validation", "test"))
    step("split")

    jieba.initialize()
    for frame in (train, validation, test):
        frame["words"] = [" ".join(w for w in jieba.lcut(s) if w.strip()) for s in frame["text"]]
        frame["chars"] = [" ".join(c for c in s if not c.isspace()) for s in frame["text"]]
    step("segment")

    import fasttext
    from gensim.models import Word2Vec

    sentences = [s.split() for s in train["words"]]
    Word2Vec(
        sentences,
        vector_size=100,
        window=5,
        min_count=2,
        sg=0,
        negative=5,
        epochs=5,
        workers=2,
        seed=1,
    )
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(train["words"]), encoding="utf-8")
        # ten threads, as zhpipe: with fewer, fastText 0.9.3 leaves most of its matrix
        # uninitialised, and the training time then varies with whatever that memory held
        fasttext.train_unsupervised(
            str(corpus),
            model="skipgram",
            dim=100,
            minn=1,
            maxn=2,
            epoch=5,
            lr=0.05,
            bucket=100000,
            thread=10,
            verbose=0,
        )
        step("embed")

        labelled = Path(tmp) / "train.txt"
        labelled.write_text(
            "\n".join(
                f"__label__{y} {w} {c}"
                for y, w, c in zip(train["label"], train["words"], train["chars"])
            ),
            encoding="utf-8",
        )
        clf = fasttext.train_supervised(
            str(labelled),
            epoch=25,
            lr=0.5,
            wordNgrams=2,
            dim=60,
            bucket=100000,
            thread=10,
            verbose=0,
        )
        got, _ = clf.predict([f"{w} {c}" for w, c in zip(test["words"], test["chars"])], k=1)
        predicted = [labels[0].removeprefix("__label__") for labels in got]
        fasttext_accuracy = float(np.mean(np.array(predicted) == test["label"].to_numpy()))
    step("train_fasttext")

    from sklearn.compose import ColumnTransformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    model = Pipeline(
        [
            (
                "features",
                ColumnTransformer(
                    [
                        (
                            "words",
                            TfidfVectorizer(
                                tokenizer=str.split,
                                token_pattern=None,
                                lowercase=False,
                                ngram_range=(1, 2),
                                sublinear_tf=True,
                                min_df=2,
                            ),
                            "words",
                        ),
                        (
                            "chars",
                            TfidfVectorizer(
                                analyzer="char", ngram_range=(1, 3), sublinear_tf=True, min_df=2
                            ),
                            "text",
                        ),
                    ]
                ),
            ),
            ("clf", LogisticRegression(C=4.0, max_iter=2000)),
        ]
    )
    model.fit(train, train["label"])
    tfidf_accuracy = float((model.predict(test) == test["label"]).mean())
    step("train_tfidf_lr")
    result = {
        "times": times,
        "total": sum(times.values()),
        "test_accuracy": {"fasttext": fasttext_accuracy, "tfidf_lr": tfidf_accuracy},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
