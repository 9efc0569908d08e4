"""A large NER corpus the shape of other corpora, for scale checks: one CoNLL file, BIO tags,
tab-separated, each sentence two random Resume NER sentences joined (so the sentences are new, the
entities real).

    python benchmarks/make_ner_corpus.py --sentences 20000 --out big.bio
    /usr/bin/time -v zhpipe run resume-ner --source big.bio --set 'train.models=[crf]'
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tasks.ner.tagging import parse_conll, spans_of


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=20000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pool = []
    for name in ("train", "dev", "test"):
        lines = (
            (ROOT / "data" / "raw" / "ResumeNER" / f"{name}.char.bmes")
            .read_text(encoding="utf-8")
            .splitlines()
        )
        pool += parse_conll(lines).sentences
    rng = random.Random(args.seed)
    out = []
    for _ in range(args.sentences):
        a, b = rng.sample(pool, 2)
        text = a.text + b.text
        spans = spans_of(a.tags) + [
            (k, s + len(a.text), e + len(a.text)) for k, s, e in spans_of(b.tags)
        ]
        bio = ["O"] * len(text)
        for kind, start, end in spans:
            bio[start:end] = [f"B-{kind}"] + [f"I-{kind}"] * (end - start - 1)
        out += [f"{c}\t{t}" for c, t in zip(text, bio)] + [""]
    args.out.write_text("\n".join(out) + "\n", encoding="utf-8")
    print(f"{args.sentences} sentences, {sum(1 for line in out if line)} characters -> {args.out}")


if __name__ == "__main__":
    main()
