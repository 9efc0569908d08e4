"""Text classification's models (`task: classification`), one module per family: tfidf (TF-IDF +
logistic regression, and the wide variant), fasttext (the supervised classifier), networks (TextCNN,
BiLSTM, Transformer encoder over Word2Vec or fastText vectors; encoded: splits as token ids on
disk), bert (a character BERT pretrained here or fine-tuned; pretraining: its masked-LM and
next-sentence data), hf (any pretrained sequence classifier), ngram and rnn_lm (n-gram and LSTM
language models, and the classifiers built from one per class), ensemble (soft voting or stacking
over the others). `SPECS` are what the kind registers (`TaskKind.models`, gathered into
tasks.stages.MODELS); `MODELS` finds them by name."""

from __future__ import annotations

from collections import ChainMap
from pathlib import Path

from tasks.classification.models import (
    bert,
    ensemble,
    estimator,
    fasttext,
    hf,
    networks,
    ngram,
    rnn_lm,
    tfidf,
)

MODELS: dict = {}  # by name, filled below
# the team's own estimators (tasks/classification/models/estimator.py), registered by name as the
# pipelines that declare them are read; REGISTRY is every classifier by name, built-in ones first
# (the ensemble's members too)
OWN = estimator.OWN
REGISTRY = ChainMap(MODELS, OWN)
SPECS = (
    fasttext.SPEC,
    networks.TEXTCNN,
    networks.BILSTM,
    networks.TRANSFORMER,
    bert.SPEC,
    hf.SPEC,
    tfidf.SPEC,
    tfidf.WIDE,
    ngram.NGRAM_LM,
    rnn_lm.SPEC,
    rnn_lm.CLASSIFIER,
    ngram.LM_CLASSIFIER,
    ensemble.spec(REGISTRY),  # over the others of this kind, the team's own included
)
MODELS.update({spec.name: spec for spec in SPECS})


def loader(name: str, folder: Path):
    """The predictor of the saved classifier `name` in `folder`: a team's estimator is known by its
    saved files (a served model's process has read no pipeline that declares it), a built-in model
    by its name."""
    if (folder / estimator.SAVED).is_file():
        return estimator.predictor(folder)
    return REGISTRY[name].load(folder)
