"""Text classification's models (`task: classification`), one module per family: tfidf (TF-IDF + logistic
regression, and the wide variant), fasttext (the supervised classifier), networks (TextCNN, BiLSTM, Transformer
encoder over Word2Vec or fastText vectors; encoded: splits as token ids on disk), bert (a character BERT pretrained
here or fine-tuned; pretraining: its masked-LM and next-sentence data), hf (any pretrained sequence classifier),
ngram and rnn_lm (n-gram and LSTM language models, and the classifiers built from one per class), ensemble (soft
voting or stacking over the others). `SPECS` are what the kind registers (`TaskKind.models`, gathered into
tasks.stages.MODELS); `MODELS` finds them by name."""
from __future__ import annotations

from tasks.classification.models import bert, ensemble, fasttext, hf, networks, ngram, rnn_lm, tfidf

MODELS: dict = {}  # by name, filled below: the ensemble reads its members here when it trains or loads
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
    ensemble.spec(MODELS),  # over the others of this kind
)
MODELS.update({spec.name: spec for spec in SPECS})
