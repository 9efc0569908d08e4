"""Imported by the segment stage's forkserver: loads jieba's dictionary once for all forked workers."""
from tasks.segmenter import default_tokenizer

default_tokenizer()
