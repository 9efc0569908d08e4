"""jieba's words per text, as the NER taggers ask for them (CRF features, the lexicon tagger's word
features, a served tagger's each text): `tasks.ner.tagged.jieba_words` against the same cut with
jieba set up again on every call (its log level and cache folder, as before it was set up once per
process), in a process that has imported what a served tagger imports (zhpipe's flow, MLflow's
pyfunc, the taggers; with --bert also transformers' BERT): jieba's `setLogLevel` walks every logger
of the process. The two alternate in rounds; prints the median milliseconds per text and the ratio.

    python benchmarks/bench_jieba_words.py [--texts 2000] [--rounds 5] [--bert]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlflow.pyfunc  # noqa: F401

import flows.orchestrate.pipeline  # noqa: F401 - the loggers of a served tagger's process
import tasks.ner.models  # noqa: F401
from tasks.ner.tagged import jieba_words
from tasks.util.segmenter import jieba_cache_dir

TEXTS = [
    "张伟，男，１９６５年出生，北京大学硕士，现任中国银行行长。",
    "王芳，研究生学历，高级经济师。",
    "曾任上海市浦东新区财政局副局长。",
]


def set_up_each_time(text: str) -> list[tuple[str, str]]:
    import jieba
    import jieba.posseg

    jieba.setLogLevel(logging.WARNING)
    jieba.dt.tmp_dir = jieba_cache_dir()
    return [(w.word, w.flag) for w in jieba.posseg.lcut(text)]


def per_text_ms(fn, texts: list[str]) -> float:
    t = time.perf_counter()
    for text in texts:
        fn(text)
    return (time.perf_counter() - t) / len(texts) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--bert",
        action="store_true",
        help="also import transformers' BERT (a BERT tagger's process)",
    )
    args = parser.parse_args()
    if args.bert:
        from transformers import BertModel  # noqa: F401
    texts = [TEXTS[i % len(TEXTS)] + str(i) for i in range(args.texts)]
    jieba_words(texts[0])  # jieba's dictionary loaded before either is timed
    loggers = len(logging.root.manager.loggerDict)
    before, now = [], []
    for _ in range(args.rounds):
        before.append(per_text_ms(set_up_each_time, texts))
        now.append(per_text_ms(jieba_words, texts))
    b, n = statistics.median(before), statistics.median(now)
    print(
        f"| jieba's words, {args.texts} texts, {loggers} loggers, {args.rounds} rounds (medians) | "
        "ms per text |"
    )
    print("|---|---|")
    print(f"| jieba set up on every call (before) | {b:.3f} |")
    print(f"| `jieba_words` (set up once per process) | {n:.3f} ({n / b:.2f}x) |")


if __name__ == "__main__":
    main()
