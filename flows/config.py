"""Validated pipeline configuration: `pipelines.yaml` becomes one pydantic object, loaded once."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flows.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = PROJECT_ROOT / "pipelines.yaml"
DEFAULT_PIPELINE = "chnsenticorp"


class _Section(BaseModel):
    """Base for every config section: unknown keys are errors, values are re-validated on --set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SourceConfig(_Section):
    path: str | None = None  # local file (relative to the project root) or file:// / http(s):// URL
    url: str | None = None  # canonical URL, fetched only when `path` does not exist
    sha256: str | None = None  # verified whenever given; a mismatch is an error
    format: Literal["auto", "csv", "tsv", "jsonl", "parquet", "txt"] = "auto"
    encoding: str = "auto"  # auto detects utf-8, utf-8-sig and GB18030/GBK
    text_column: str = "text"
    label_column: str | None = "label"  # None for unlabelled corpora (txt)
    member: str | None = None  # file inside a .zip archive; default: its only data file

    @model_validator(mode="after")
    def _has_location(self) -> "SourceConfig":
        if not self.path and not self.url:
            raise ValueError("source needs `path` or `url`")
        return self


class DownloadConfig(_Section):
    timeout_s: float = 60.0  # per network read; a stalled server fails instead of hanging
    retries: int = 3  # Prefect task retries for network errors only
    chunk_bytes: int = 1 << 20


class CleanConfig(_Section):
    nfkc: bool = True  # full-width to half-width
    strip_html: bool = True
    strip_urls: bool = True
    traditional_to_simplified: bool = False  # OpenCC t2s
    min_chars: int = Field(2, ge=0)
    max_chars: int = Field(5000, ge=1)
    dedupe: bool = True


class SplitConfig(_Section):
    train: float = Field(0.8, gt=0, lt=1)
    validation: float = Field(0.1, gt=0, lt=1)
    test: float = Field(0.1, gt=0, lt=1)
    seed: int = 42

    @model_validator(mode="after")
    def _sums_to_one(self) -> "SplitConfig":
        if abs(self.train + self.validation + self.test - 1.0) > 1e-6:
            raise ValueError("split fractions train + validation + test must sum to 1")
        return self


class SegmentConfig(_Section):
    mode: Literal["precise", "search", "full"] = "precise"
    hmm: bool = True  # HMM discovers words missing from the dictionary
    user_dict: str | None = None  # jieba user dictionary: "word [freq] [pos]" per line
    stopwords: str | None = None  # one word per line; dropped from word tokens only
    pos: bool = False  # also store jieba.posseg tags (slower)
    workers: int = Field(0, ge=0)  # 0 = one process per core
    chunk_rows: int = Field(1000, ge=1)  # smaller chunks even out the last workers; larger cut IPC


class ProfileConfig(_Section):
    top_k: int = Field(20, ge=1)  # words and adjectives shown per label
    cloud_words: int = Field(150, ge=10)  # words in each word cloud
    pos_texts: int = Field(1500, ge=1)  # train texts per label POS-tagged for adjectives (a seeded sample)
    coverage: float = Field(0.9, gt=0, lt=1)  # the suggested max_len covers this share of texts
    font: str | None = None  # a font file with Chinese glyphs; default: an installed one (Noto CJK, WenQuanYi, ...)
    seed: int = 0


class PivotConfig(_Section):
    lang: str  # pivot language, e.g. en, ja
    forward: str | None = None  # zh -> pivot: a model id (hub) or a local folder (transformers backend)
    backward: str | None = None  # pivot -> zh; None = the forward model (multilingual NLLB-200, M2M100)
    source_code: str | None = None  # language codes of multilingual models: zho_Hans (NLLB), zh (M2M100)
    pivot_code: str | None = None  # eng_Latn (NLLB), en (M2M100); None for MarianMT pairs


class HttpTranslationConfig(_Section):
    url: str = "http://127.0.0.1:5000"  # a LibreTranslate-compatible service: POST {url}/translate
    api_key_env: str | None = "LIBRETRANSLATE_API_KEY"  # read from the environment; never logged
    requests_per_second: float = Field(5.0, gt=0)
    timeout_s: float = 30.0
    retries: int = Field(5, ge=0)  # on 429, 5xx and transport errors, with exponential back-off
    batch_size: int = Field(16, ge=1)  # texts per request (`q` as a list)


class TranslationFilterConfig(_Section):
    min_length_ratio: float = 0.5  # back-translation length / source length
    max_length_ratio: float = 2.0
    min_similarity: float = 0.15  # chrF to the source, 0-1: below = meaning probably lost
    max_similarity: float = 0.95  # above = a near copy that adds nothing
    min_chinese: float = 0.6  # share of CJK characters among letters and CJK characters


class BackTranslationConfig(_Section):
    backend: Literal["transformers", "http"] = "transformers"
    source_lang: str = "zh"
    pivots: list[PivotConfig] = [
        PivotConfig(lang="en", forward="Helsinki-NLP/opus-mt-zh-en", backward="Helsinki-NLP/opus-mt-en-zh")
    ]
    batch_size: int = Field(16, ge=1)  # sentences per generate() call, batched by length
    max_length: int = Field(256, ge=8)  # generated tokens
    split_chars: int = Field(120, ge=10)  # longer texts are split at sentence punctuation and joined back
    num_beams: int = Field(4, ge=1)
    do_sample: bool = False  # sampling instead of beam search, for more diverse variants
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    num_variants: int = Field(1, ge=1)  # back-translations per sentence and pivot
    max_rows: int | None = Field(None, ge=1)  # translate at most this many train rows (cost control)
    http: HttpTranslationConfig = HttpTranslationConfig()
    filters: TranslationFilterConfig = TranslationFilterConfig()


class AugmentConfig(_Section):
    method: str = "eda"  # a name in tasks.augment.AUGMENTERS: eda, backtranslation, none
    fallback: Literal["none", "eda"] = "none"  # when back-translation models are missing: fail, or run EDA
    num_aug: int = Field(1, ge=0)  # EDA: new rows per source row
    p_swap: float = Field(0.1, ge=0, le=1)  # EDA: fraction of words swapped
    p_delete: float = Field(0.1, ge=0, le=1)  # EDA: each word deleted with this probability
    p_insert: float = Field(0.1, ge=0, le=1)  # EDA: fraction of words re-inserted at random places
    seed: int = 13
    device: str = "auto"  # translation models: auto = CUDA when present (bf16), else CPU
    backtranslation: BackTranslationConfig = BackTranslationConfig()


class VocabConfig(_Section):
    min_freq: int = Field(2, ge=1)
    max_size: int | None = Field(50000, ge=1)
    specials: list[str] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    @field_validator("specials")
    @classmethod
    def _pad_unk_first(cls, v: list[str]) -> list[str]:
        if v[:2] != ["[PAD]", "[UNK]"]:
            raise ValueError("specials must start with [PAD], [UNK] (ids 0 and 1)")
        return v


def _fasttext_dim(v: int) -> int:
    """fastText 0.9.3 leaves the last (rows * dim) % 10 input values uninitialised (see tasks/embed.py)."""
    if v % 10:
        raise ValueError(f"fastText dim must be a multiple of 10 (fastText 0.9.3 leaves part of its matrix uninitialised otherwise), got {v}")
    return v


class Word2VecConfig(_Section):
    vector_size: int = 128
    window: int = 5
    min_count: int = 2
    sg: bool = False  # False = CBOW, True = skip-gram
    hs: bool = False  # True = hierarchical softmax instead of negative sampling
    negative: int = 5
    epochs: int = 10


class FastTextEmbedConfig(_Section):
    enabled: bool = True
    model: Literal["skipgram", "cbow"] = "skipgram"
    dim: int = 100
    minn: int = 1  # Chinese words are short: subwords of 1-2 characters
    maxn: int = 2
    epoch: int = 5
    lr: float = 0.05  # fastText's default
    bucket: int = 100000  # hashed subword buckets; 2M (fastText's default) makes an 800 MB model

    _dim = field_validator("dim")(_fasttext_dim)


class EmbedConfig(_Section):
    word2vec: Word2VecConfig = Word2VecConfig()
    fasttext: FastTextEmbedConfig = FastTextEmbedConfig()
    probe_words: list[str] = ["酒店", "服务", "干净"]
    topn: int = 5
    workers: int = Field(2, ge=1)  # gensim threads; >1 trades bit-exact reproducibility for speed
    seed: int = 1
    plot_words: int = Field(150, ge=10)  # the most frequent words drawn in the 2-D projection
    tsne: bool = False  # also a t-SNE projection (slower than PCA)
    projector_words: int = Field(5000, ge=10)  # words exported for the TensorBoard projector


class FastTextClassifierConfig(_Section):
    epoch: int = 25
    lr: float = 0.5
    word_ngrams: int = 2
    dim: int = 60
    minn: int = 0
    maxn: int = 0
    bucket: int = 100000  # the model file is about bucket * dim * 4 bytes
    tokens: Literal["words", "chars", "both"] = "both"

    _dim = field_validator("dim")(_fasttext_dim)


class TextCNNConfig(_Section):
    kernel_sizes: list[int] = [2, 3, 4]
    num_filters: int = 128
    dropout: float = 0.5
    max_len: int = 256  # tokens; covers > 95% of reviews
    freeze_embeddings: bool = False
    lr: float = 1e-3
    batch_size: int = 64


class BiLSTMSectionConfig(_Section):
    hidden_size: int = 128  # per direction
    num_layers: int = 1
    dropout: float = 0.3
    max_len: int = 256
    freeze_embeddings: bool = False
    lr: float = 2e-3
    batch_size: int = 64


class TransformerSectionConfig(_Section):
    d_model: int | None = None  # None = the Word2Vec vector size, so the embed stage's vectors fit as they are
    num_heads: int = 4
    num_layers: int = 2
    ff_dim: int = 256
    dropout: float = 0.1
    max_len: int = 256
    freeze_embeddings: bool = False
    lr: float = 5e-4
    batch_size: int = 64


class BertSectionConfig(_Section):
    # a hub id or local folder of a pretrained Chinese BERT (e.g. bert-base-chinese); None = pretrain a
    # small BERT here with masked-LM on the train split's characters, vocabulary from the vocab stage
    checkpoint: str | None = None
    hidden_size: int = 192
    num_layers: int = 3
    num_heads: int = 3
    intermediate_size: int = 768
    dropout: float = 0.1
    max_len: int = 160  # characters, [CLS] and [SEP] included; covers ~80% of reviews whole
    pretrain_epochs: int = Field(8, ge=0)  # masked-LM epochs before fine-tuning (0 = fine-tune from random)
    pretrain_lr: float = 1e-3
    mlm_probability: float = Field(0.15, gt=0, lt=1)  # of which 80% -> [MASK], 10% random, 10% kept
    lr: float = 2e-4  # fine-tuning
    batch_size: int = 32
    word_adapter: bool = False  # add attention-weighted Word2Vec vectors of the words covering each character
    adapter_layer: int = Field(1, ge=0)  # after which encoder layer (0-based, not the last) the adapter adds its vectors
    max_words_per_char: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "BertSectionConfig":
        if self.checkpoint is None and self.hidden_size % self.num_heads:
            raise ValueError(f"bert.hidden_size ({self.hidden_size}) must be a multiple of bert.num_heads ({self.num_heads})")
        if self.checkpoint is None and self.word_adapter and self.adapter_layer >= self.num_layers - 1:
            raise ValueError(f"bert.adapter_layer ({self.adapter_layer}) must be below the last layer ({self.num_layers - 1}): "
                             "a later layer has to carry the words to [CLS]")
        return self


class RnnLMConfig(_Section):
    embed_dim: int = 128
    hidden_size: int = 256
    num_layers: int = 1
    dropout: float = 0.3
    cutoffs: list[int] = [2000, 10000]  # adaptive softmax: frequency ranks where cheaper output clusters start
    tokens: Literal["words", "chars"] = "words"
    max_len: int = 256
    lr: float = 2e-3
    batch_size: int = 32


class TfidfLRConfig(_Section):
    word_ngrams: list[int] = [1, 2]  # n-gram range over jieba words
    char_ngrams: list[int] = [1, 3]  # n-gram range over characters
    min_df: int = Field(2, ge=1)
    C: float = Field(4.0, gt=0)  # inverse regularisation strength
    class_weight: Literal["balanced"] | None = None


class NgramLMConfig(_Section):
    n: int = Field(3, ge=1, le=6)
    method: Literal["backoff", "kneser_ney"] = "kneser_ney"  # backoff = fixed weight, as in the course notes
    backoff: float = Field(0.4, gt=0, lt=1)  # weight of the lower order for an unseen n-gram (backoff)
    discount: float = Field(0.75, gt=0, lt=1)  # absolute discount (kneser_ney)
    tokens: Literal["words", "chars"] = "words"


LANGUAGE_MODELS = {"ngram_lm", "rnn_lm"}  # evaluated by perplexity, not as classifiers


class TrainConfig(_Section):
    models: list[Literal[
        "fasttext", "textcnn", "bilstm", "transformer", "bert", "tfidf_lr", "ngram_lm", "rnn_lm", "lm_classifier"
    ]] = ["fasttext", "textcnn"]
    epochs: int = Field(6, ge=1)  # every PyTorch model
    patience: int = Field(2, ge=1)  # early stopping on validation macro-F1 (perplexity for rnn_lm)
    device: str = "auto"  # auto = CUDA, then Apple MPS, then CPU; or cpu, cuda, cuda:1, mps
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto = bf16 autocast on CUDA that supports it
    # the embed stage's vectors that initialise the word networks' embeddings (and bert's word adapter);
    # fastText builds a vector for every token from its subwords, Word2Vec only for words it has seen
    embeddings: Literal["word2vec", "fasttext"] = "word2vec"
    seed: int = 7
    # PyTorch networks: AdamW, linear warm-up then linear decay to 0 over all epochs
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)  # share of optimizer steps spent warming up
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None = no clipping
    grad_accum: int = Field(1, ge=1)  # batches per optimizer step (a larger effective batch)
    class_weights: bool = False  # weight the loss by inverse class frequency (imbalanced corpora)
    # run this stage as a deployment run on another Prefect work pool (GPU workers); not part of the key
    work_pool: str | None = Field(None, exclude=True)
    fasttext: FastTextClassifierConfig = FastTextClassifierConfig()
    textcnn: TextCNNConfig = TextCNNConfig()
    bilstm: BiLSTMSectionConfig = BiLSTMSectionConfig()
    transformer: TransformerSectionConfig = TransformerSectionConfig()
    bert: BertSectionConfig = BertSectionConfig()
    tfidf_lr: TfidfLRConfig = TfidfLRConfig()
    rnn_lm: RnnLMConfig = RnnLMConfig()  # a language model: evaluated by test perplexity
    ngram_lm: NgramLMConfig = NgramLMConfig()  # a language model: evaluated by test perplexity
    lm_classifier: NgramLMConfig = NgramLMConfig()  # one n-gram LM per class; the lowest perplexity wins

    @model_validator(mode="after")
    def _has_a_classifier(self) -> "TrainConfig":
        if not set(self.models) - LANGUAGE_MODELS:
            raise ValueError("train.models needs at least one classifier (ngram_lm and rnn_lm are language models only)")
        return self


class EvaluateConfig(_Section):
    metric: Literal["accuracy", "macro_f1"] = "accuracy"  # picks the best model


class StagesConfig(_Section):
    download: DownloadConfig = DownloadConfig()
    clean: CleanConfig = CleanConfig()
    split: SplitConfig = SplitConfig()
    segment: SegmentConfig = SegmentConfig()
    profile: ProfileConfig = ProfileConfig()
    augment: AugmentConfig = AugmentConfig()
    vocab: VocabConfig = VocabConfig()
    embed: EmbedConfig = EmbedConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvaluateConfig = EvaluateConfig()

    @model_validator(mode="after")
    def _transformer_heads_divide_d_model(self) -> "StagesConfig":
        t = self.train.transformer
        vectors = self.embed.fasttext.dim if self.train.embeddings == "fasttext" else self.embed.word2vec.vector_size
        d_model = t.d_model or vectors
        if "transformer" in self.train.models and d_model % t.num_heads:
            raise ValueError(f"train.transformer: d_model {d_model} (d_model, else the size of the train.embeddings vectors) "
                             f"must be a multiple of num_heads ({t.num_heads})")
        return self


class ScheduleConfig(_Section):
    """When a deployed pipeline runs: a cron line in a time zone, or a fixed interval."""

    cron: str | None = None  # e.g. "0 3 * * *"
    interval: float | None = Field(None, gt=0)  # seconds
    timezone: str = "UTC"  # IANA name, e.g. Asia/Shanghai
    active: bool = True

    @model_validator(mode="after")
    def _one_kind(self) -> "ScheduleConfig":
        if (self.cron is None) == (self.interval is None):
            raise ValueError("schedule needs exactly one of `cron` or `interval`")
        if self.cron is not None:
            from prefect._internal.schemas.validators import validate_cron_string  # the server's own check

            try:
                validate_cron_string(self.cron)
            except ValueError:
                raise ValueError(f"schedule.cron: {self.cron!r} is not a valid cron line (minute hour day month weekday)") from None
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"schedule.timezone: unknown time zone {self.timezone!r} (expected an IANA name such as Asia/Shanghai)") from None
        return self


STAGE_NAMES = ("download", "clean", "split", "segment", "profile", "augment", "vocab", "embed", "train", "evaluate")


class RunParameters(_Section):
    """Default parameters of a deployed pipeline's runs (each can be changed per run in the Prefect UI)."""

    overrides: list[str] = []  # `--set` assignments, e.g. ["train.epochs=2"]
    stages: list[Literal[STAGE_NAMES]] | None = None  # None = all
    force: list[Literal[STAGE_NAMES]] | None = None  # rebuild these stages and all later ones; [] = all


class PipelineConfig(_Section):
    name: str
    description: str = ""
    source: SourceConfig
    stages: StagesConfig = StagesConfig()
    # deployment (`zhpipe deploy`, `zhpipe serve`) and execution; none of these is part of a stage key
    schedule: ScheduleConfig | None = None
    parameters: RunParameters = RunParameters()
    work_pool: str = "zhpipe"  # the pool whose workers run the pipeline flow
    runner: Literal["local", "dask"] = "local"  # dask: chunked stages run on a Dask cluster
    dask_address: str | None = None  # scheduler address (tcp://host:8786); None with runner dask = a local cluster
    storage: str | None = None  # stage store root: a folder or an fsspec URL; default data/ (ZHPIPE_STORAGE wins)

    def config_hash(self) -> str:
        """Short hash of the resolved config, tagged on every MLflow parent run."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def flat_params(self) -> dict[str, str]:
        """Resolved config as dotted `section.key` strings, for MLflow params."""
        flat = flatten(self.model_dump(mode="json", exclude={"name", "description"}))
        return {k.removeprefix("stages."): json.dumps(v, ensure_ascii=False) if isinstance(v, list) else str(v) for k, v in flat.items()}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with dotted keys."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _describe(err: ValidationError, where: str) -> str:
    """One line per pydantic error: the dotted key, what is wrong and, for unknown keys, what is allowed."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        parent = _model_at(PipelineConfig, first["loc"][:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return f"{where}: unknown key '{loc}' (allowed keys: {allowed})"
    if first["type"] == "missing":
        return f"{where}: missing required key '{loc}'"
    return f"{where}: '{loc}': {first['msg']} (got {first.get('input')!r})"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def _apply_set(raw: dict, assignment: str) -> None:
    """Apply one `--set section.key=value` to the raw pipeline dict."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected STAGE.PARAM=VALUE")
    dotted, value = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) < 2:
        raise ConfigError(f"--set {assignment!r}: expected STAGE.PARAM=VALUE (e.g. train.epochs=2)")
    node = raw.setdefault("source", {}) if parts[0] == "source" else raw.setdefault("stages", {}).setdefault(parts[0], {})
    for part in parts[1:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: '{part}' is not a section")
    # lists, mappings and null are YAML; scalars stay strings and pydantic converts them to the field's
    # type, so `source.sha256=0123...` stays a string instead of becoming the number 123...
    text = value.strip()
    node[parts[-1]] = yaml.safe_load(text) if text[:1] in "[{" or text in ("null", "~") else text


def load_pipeline(
    name: str = DEFAULT_PIPELINE,
    config_file: Path | str = DEFAULT_CONFIG,
    overrides: list[str] = (),
    source_overrides: dict[str, Any] | None = None,
) -> PipelineConfig:
    """Read `pipelines.yaml`, pick one pipeline, apply --set and --source overrides, validate."""
    config_file = Path(config_file)
    try:
        doc = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config {config_file}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{config_file}: invalid YAML: {e}") from e
    pipelines = doc.get("pipelines") if isinstance(doc, dict) else None
    if not isinstance(pipelines, dict):
        raise ConfigError(f"{config_file}: expected a top-level 'pipelines:' mapping")
    if name not in pipelines:
        raise ConfigError(f"{config_file}: no pipeline '{name}' (declared: {', '.join(pipelines)})")
    raw = json.loads(json.dumps(pipelines[name]))  # deep copy; YAML anchors resolved
    raw["name"] = name
    for assignment in overrides:
        _apply_set(raw, assignment)
    if source_overrides:
        raw["source"] = {**{k: v for k, v in source_overrides.items() if v is not None}}
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_describe(e, f"{config_file} pipeline '{name}'")) from e


def list_pipelines(config_file: Path | str = DEFAULT_CONFIG) -> dict[str, str]:
    """Pipeline names and descriptions declared in the config file."""
    doc = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
    return {k: (v or {}).get("description", "") for k, v in (doc.get("pipelines") or {}).items()}
