"""The model registry: one module per model family, one entry per model. Adding a model is a new module with
a `ModelSpec` and one line in `MODELS`; its `train.<name>` config section comes from the spec's `params`."""
from __future__ import annotations

import os

# oneDNN, PyTorch's CPU kernels, keeps a compiled primitive per input shape (1,024 by default), each with its
# scratch memory, and length-bucketed batches each have a shape of their own: a TextCNN epoch grew by about
# 30 KB a row (10,000 rows 1.3-1.4 GB peak, 40,000 rows 2.3 GB; with 8 kept, 1.1-1.2 GB for both, as fast). It is read
# when the first primitive is made, so setting it before a model trains is enough; a value set outside wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

from tasks.models import bert, ensemble, fasttext, hf, ner, networks, ngram, rnn_lm, seq2seq, tfidf  # noqa: E402
from tasks.models.base import ModelSpec, Predictor, TrainInputs  # noqa: E402

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
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
    ner.CRF_TAGGER,
    ner.BILSTM_CRF,
    ner.LEXICON_TAGGER,
    ner.NER_ENSEMBLE,
    seq2seq.SEQ2SEQ,
    seq2seq.SEQ2SEQ_ATTENTION,
    seq2seq.TRANSFORMER_MT,
)}
MODELS["ensemble"] = ensemble.spec(MODELS)

__all__ = ["MODELS", "ModelSpec", "Predictor", "TrainInputs", "get"]


def get(name: str) -> ModelSpec:
    """The spec of a registered model; an unknown name is one clear error."""
    from tasks.errors import ConfigError

    if name not in MODELS:
        raise ConfigError(f"unknown model '{name}' (registered: {', '.join(MODELS)})")
    return MODELS[name]
