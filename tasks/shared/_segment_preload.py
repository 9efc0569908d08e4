"""Imported by the segment stage's forkserver: loads jieba's and jieba-rs's dictionaries once for
all forked workers."""

from tasks.util.segmenter import default_rs, default_tokenizer

default_tokenizer()
default_rs()
