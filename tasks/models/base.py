"""What the train and evaluate stages know about a model: its `ModelSpec` (params, how it trains,
predicts, saves and loads) and the inputs every trainer receives. Nothing here knows a particular
model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tasks.core import MetricSink, Section
from tasks.util.vectors import WordVectors

if TYPE_CHECKING:  # annotations only: the heavy libraries are imported where they are used
    import torch

# frame with text/words/chars -> (rows, classes) probabilities
Predictor = Callable[[pd.DataFrame], np.ndarray]

# the `train` section's shared settings a model may read (`ModelSpec.shared`): its key sees those
# and no others
LOOP = (
    "epochs",
    "patience",
    "weight_decay",
    "warmup_ratio",
    "grad_clip",
    "grad_accum",
    "device",
    "precision",
    "seed",
    "processes",
    "budget",
    "model_budget",
)
# PyTorch classifiers that start from the embed stage's vectors
NETWORK = (*LOOP, "class_weights", "embeddings")


def loop_without(*names: str) -> tuple[str, ...]:
    """The shared settings less `names` (a kind whose models hold them in their own sections, or
    read none), in LOOP's order."""
    return tuple(n for n in LOOP if n not in names)


class SettingsView:
    """The `train` section as one model sees it: its own section and the shared settings its spec
    declares. Reading any other shared setting is an error, so a declaration that leaves one out
    cannot go unnoticed (and a unit key that does not hash a setting is a key the model really does
    not depend on)."""

    def __init__(self, params: Any, name: str, shared: tuple[str, ...]):
        self._params, self._name, self._shared = params, name, set(shared)

    def __getattr__(self, key: str) -> Any:
        if key == self._name or key in self._shared:
            return getattr(self._params, key)
        raise AttributeError(
            f"model {self._name!r} reads train.{key}, which its ModelSpec.shared does not declare "
            f"(declared: {', '.join(sorted(self._shared)) or 'none'})"
        )


@dataclass
class TrainInputs:
    """Everything a model's `train` may use. It saves the model under `out / name` and returns a
    summary (`seconds`, `samples_per_second`, `history` per epoch, ...)."""

    name: str
    # augmented train rows (`aug_method` tells the originals); a `Rows` for a model that streams
    train: pd.DataFrame
    validation: pd.DataFrame
    labels: list[str]
    # the train stage's Params: common settings, and `getattr(params, name)` is the model's own
    params: Any
    vocab: Path  # the vocab stage's folder (`words/vocab.txt`, `chars/vocab.txt`)
    vectors: WordVectors | None  # the embed stage's vectors, for models with `uses_vectors`
    out: Path
    scratch: Path  # per-epoch checkpoints a killed run resumes from
    sink: MetricSink | None = None
    # the embed stage's folder (the taggers read their character, bigram and word vectors)
    embed: Path | None = None
    # ensembles: each member's saved model folder
    members: dict[str, Path] = field(default_factory=dict)
    # the project folder: where a team's own modules are found first
    root: Path = field(default_factory=Path.cwd)

    @property
    def section(self) -> Any:
        """The model's own params (`train.<name>`)."""
        return getattr(self.params, self.name)


@dataclass(frozen=True)
class ModelSpec:
    """One model a kind registers (in its `SPECS`; every kind's by name: tasks.stages.MODELS)."""

    name: str
    params: type[Section]  # the `train.<name>` config section, one declaration per setting
    train: Callable[[TrainInputs], dict]
    # a saved model folder -> the function that answers as its kind's models answer: a classifier's
    # class probabilities of a frame (a `Predictor`), a tagger's tags of texts, a translator's
    # translations of a frame. None: a language model, scored by `perplexity`
    load: Callable[[Path], Callable] | None = None
    # its `train` reads `TrainInputs.train`/`validation` as `tasks.util.io.Rows` (batches from the
    # split's file, memory bounded whatever the corpus) instead of frames
    streams: bool = False
    # language models: perplexity of texts
    perplexity: Callable[[Path, pd.DataFrame], float] | None = None
    uses_vectors: bool = False  # starts from the embed stage's word vectors
    about: str = ""  # one line for `zhpipe models`
    # or "ner", "translation": the pipelines (`task:`) whose train.models it may be in
    task: str = "classification"
    # ensembles: the models (of train.models) built from, by section
    members: Callable[[Any], list[str]] | None = None
    # the `train` section's shared settings it reads (None: all of them); a unit's key hashes only
    # these
    shared: tuple[str, ...] | None = None
    # its place in the cost order (to train, serve and explain): selection prefers the cheaper of
    # two models whose validation scores are within the noise; linear models 0, fastText 1, neural
    # networks 2, pretrained and ensembles 3
    cost: int = 2
    # trains through the shared loop (tasks/models/trainer.py), so a budget can race it
    # (tasks/models/racing.py); the others (seconds each) always train whole
    races: bool = False
    # a team's own model declared in a pipeline (`train.<name>: {estimator: ...}`): known only to
    # the pipelines that declare it
    own: bool = False
    # the distributions its training and its saved model import, beyond its stages' own: what its
    # unit's key sees (with the stage's `libraries`) and what its logged model requires
    libraries: tuple[str, ...] = ()

    def view(self, params: Any) -> Any:
        """`params` (the train section) as this model may read it."""
        return params if self.shared is None else SettingsView(params, self.name, self.shared)

    @property
    def is_language_model(self) -> bool:
        """Language models are scored by perplexity, not as classifiers, taggers or translators."""
        return self.load is None


def label_ids(df: pd.DataFrame, labels: list[str]) -> np.ndarray:
    """The `label` column as class indices in `labels` order."""
    index = {label: i for i, label in enumerate(labels)}
    return df["label"].map(index).to_numpy(dtype=np.int64)


def class_weight_tensor(y: np.ndarray, num_classes: int) -> torch.Tensor:
    """Inverse class frequency, normalised so a balanced corpus gets weight 1 everywhere."""
    import torch

    counts = np.bincount(y, minlength=num_classes).astype(np.float32)
    return torch.from_numpy(len(y) / (num_classes * np.maximum(counts, 1)))
