"""Machine translation for back-translation: local seq2seq models, a LibreTranslate-style HTTP
service, and a persistent SQLite cache in front of either. No I/O besides the model files, the HTTP
calls and the cache file."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from tasks.core import Section
from tasks.errors import ZhpipeError
from tasks.util.hub import load_pretrained
from tasks.util.urls import is_loopback, redact, reveal

log = logging.getLogger("zhpipe.translation")
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;…\n])")


class PivotParams(Section):
    """One pivot language and its translation models."""

    lang: str  # pivot language, e.g. en, ja
    # zh -> pivot: a model id (hub) or a local folder (transformers backend)
    forward: str | None = None
    # pivot -> zh; None = the forward model (multilingual NLLB-200, M2M100)
    backward: str | None = None
    # language codes of multilingual models: zho_Hans (NLLB), zh (M2M100)
    source_code: str | None = None
    pivot_code: str | None = None  # eng_Latn (NLLB), en (M2M100); None for MarianMT pairs


class HttpTranslationParams(Section):
    """A LibreTranslate-compatible HTTP service."""

    url: str = "http://127.0.0.1:5000"  # a LibreTranslate-compatible service: POST {url}/translate
    api_key_env: str | None = "LIBRETRANSLATE_API_KEY"  # read from the environment; never logged
    requests_per_second: float = Field(5.0, gt=0)
    timeout_s: float = 30.0
    retries: int = Field(5, ge=0)  # on 429, 5xx and transport errors, with exponential back-off
    batch_size: int = Field(16, ge=1)  # texts per request (`q` as a list)


class TranslationFilterParams(Section):
    """Quality filters on back-translations."""

    min_length_ratio: float = 0.5  # back-translation length / source length
    max_length_ratio: float = 2.0
    min_similarity: float = 0.15  # chrF to the source, 0-1: below = meaning probably lost
    max_similarity: float = 0.95  # above = a near copy that adds nothing
    min_chinese: float = 0.6  # share of CJK characters among letters and CJK characters


class BackTranslationParams(Section):
    """The `augment.backtranslation` section."""

    # transformers: hub or local seq2seq models; http: a LibreTranslate-style service; zhpipe:
    # translators registered by zhpipe's own translation pipelines, `forward`/`backward` as
    # models:/<name>@<alias> (or /<version>)
    backend: Literal["transformers", "http", "zhpipe"] = "transformers"
    source_lang: str = "zh"
    pivots: list[PivotParams] = [
        PivotParams(
            lang="en", forward="Helsinki-NLP/opus-mt-zh-en", backward="Helsinki-NLP/opus-mt-en-zh"
        )
    ]
    batch_size: int = Field(16, ge=1)  # sentences per generate() call, batched by length
    max_length: int = Field(256, ge=8)  # generated tokens
    # longer texts are split at sentence punctuation and joined back
    split_chars: int = Field(120, ge=10)
    num_beams: int = Field(4, ge=1)
    do_sample: bool = False  # sampling instead of beam search, for more diverse variants
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    num_variants: int = Field(1, ge=1)  # back-translations per sentence and pivot
    # translate at most this many train rows (cost control)
    max_rows: int | None = Field(None, ge=1)
    http: HttpTranslationParams = HttpTranslationParams()
    filters: TranslationFilterParams = TranslationFilterParams()


class Translator(Protocol):
    """Translates a batch of texts; returns `n` variants per text."""

    name: str  # what identifies the translations in the cache (model id or service URL)

    def translate(self, texts: list[str], n: int) -> list[list[str]]: ...


def split_sentences(text: str, max_chars: int) -> list[str]:
    """Cut a long text after sentence punctuation into pieces of at most ~max_chars; short texts
    stay whole."""
    if len(text) <= max_chars:
        return [text]
    pieces, current = [], ""
    for sentence in (s for s in _SENTENCE_END.split(text) if s):
        if current and len(current) + len(sentence) > max_chars:
            pieces.append(current)
            current = ""
        current += sentence
    if current:
        pieces.append(current)
    return pieces


class Seq2SeqTranslator:
    """A transformers seq2seq model (MarianMT, NLLB-200, M2M100), batched by length on the chosen
    device."""

    def __init__(
        self,
        ref: str,
        params: BackTranslationParams,
        device: str,
        src_code: str | None = None,
        tgt_code: str | None = None,
    ):
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.name, self.params = ref, params

        def load(source: str, local_only: bool):
            return (
                AutoTokenizer.from_pretrained(source, local_files_only=local_only),
                AutoModelForSeq2SeqLM.from_pretrained(source, local_files_only=local_only),
            )

        self.tokenizer, self.model = load_pretrained(ref, load, "translation model")
        self.device = torch.device(
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else ("cpu" if device == "auto" else device)
        )
        if self.device.type == "cuda":
            # bf16 halves memory and speeds up generation
            self.model = self.model.to(dtype=torch.bfloat16)
        self.model.to(self.device).eval()
        self.forced_bos = None
        if src_code:
            self.tokenizer.src_lang = src_code
        if tgt_code:
            # M2M100 wants __en__, NLLB eng_Latn
            lang_id = getattr(self.tokenizer, "get_lang_id", None)
            self.forced_bos = (
                lang_id(tgt_code) if lang_id else self.tokenizer.convert_tokens_to_ids(tgt_code)
            )

    def translate(self, texts: list[str], n: int) -> list[list[str]]:
        """Generate `n` variants per text: beam search (n best beams) or sampling."""
        import torch

        p = self.params
        batch = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=p.max_length
        ).to(self.device)
        kwargs = dict(max_new_tokens=p.max_length, num_return_sequences=n)
        if p.do_sample:
            kwargs.update(do_sample=True, temperature=p.temperature, top_p=p.top_p)
        else:
            kwargs.update(num_beams=max(p.num_beams, n))
        if self.forced_bos is not None:
            kwargs["forced_bos_token_id"] = self.forced_bos
        with torch.inference_mode():
            out = self.model.generate(**batch, **kwargs)
        decoded = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        return [decoded[i * n : (i + 1) * n] for i in range(len(texts))]


class RegisteredTranslator:
    """A translator that a zhpipe translation pipeline registered (backend zhpipe), read from its
    model folder as MLflow stores it (`MLmodel`, `artifacts/zhpipe.json`, `artifacts/<model>/`): the
    text is cleaned (and, for a Chinese source, segmented) as that pipeline did, then translated by
    its beam search. `name` is the resolved `models:/<name>/<version>`, so the translation cache
    never mixes two versions."""

    def __init__(self, name: str, folder: Path, spec_of: Callable[[str], Any]):
        import yaml

        from tasks.classification.clean import Params as CleanParams
        from tasks.util.segmenter import Segmenter, SegmenterParams

        self.name = name
        try:
            mlmodel = yaml.safe_load((folder / "MLmodel").read_text(encoding="utf-8"))
            artifacts = mlmodel["flavors"]["python_function"]["artifacts"]
            cfg = json.loads((folder / artifacts["config"]["path"]).read_text(encoding="utf-8"))
            # a translation pipeline's model: the store knows every kind's
            spec = spec_of(cfg["model"])
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise ZhpipeError(
                f"{name}: not a zhpipe translator ({type(e).__name__}: {e}); register one with a "
                "task: "
                f"translation pipeline"
            ) from None
        if spec.task != "translation" or spec.load is None:
            raise ZhpipeError(f"{name}: {cfg['model']} is a {spec.task} model, not a translator")
        self.translate_fn = spec.load(folder / artifacts["model"]["path"])
        self.direction = self.translate_fn.direction
        clean = CleanParams(
            **{k: v for k, v in cfg["clean"].items() if k in CleanParams.model_fields}
        )
        self.clean = (
            clean
            if self.direction.startswith("zh")
            else clean.model_copy(update={"traditional_to_simplified": False})
        )
        segment = {
            k: v
            for k, v in cfg["segment"].items()
            if k in SegmenterParams.model_fields and k not in ("user_dict", "stopwords")
        }
        self.segmenter = (
            Segmenter(SegmenterParams(**segment)) if self.direction.startswith("zh") else None
        )

    def translate(self, texts: list[str], n: int) -> list[list[str]]:
        """The best beam per text (`n` > 1 repeats it)."""
        import pandas as pd

        from tasks.shared.normalise import clean_text

        cleaned = [clean_text(t, self.clean) for t in texts]
        frame = (
            pd.DataFrame({"text": cleaned, **self.segmenter.rows(cleaned)})
            if self.segmenter
            else pd.DataFrame({"en": cleaned})
        )
        return [[t.text] * n for t in self.translate_fn(frame)]


class HttpTranslator:
    """A LibreTranslate-compatible service: POST /translate {q, source, target, api_key, format}."""

    def __init__(self, params: HttpTranslationParams, source: str, target: str):
        import httpx

        self.params, self.source, self.target = params, source, target
        self.name = f"{redact(params.url).rstrip('/')}/translate"  # what messages show
        self.endpoint = f"{reveal(params.url).rstrip('/')}/translate"
        self.api_key = os.environ.get(params.api_key_env) if params.api_key_env else None
        if self.api_key and not (
            self.endpoint.lower().startswith("https://") or is_loopback(self.endpoint)
        ):
            raise ZhpipeError(
                f"translation service {self.name}: an API key (${params.api_key_env}) is sent only "
                "over "
                f"https or to this machine (loopback); use an https:// url"
            )
        self.client = httpx.Client(timeout=params.timeout_s)
        self._next_slot = 0.0
        self._lock = threading.Lock()

    def _wait_for_slot(self) -> None:
        """Client-side rate limit: at most `requests_per_second`."""
        with self._lock:
            now = time.monotonic()
            wait = self._next_slot - now
            self._next_slot = max(now, self._next_slot) + 1.0 / self.params.requests_per_second
        if wait > 0:
            time.sleep(wait)

    def translate(self, texts: list[str], n: int) -> list[list[str]]:
        """One variant per text (a service returns its single best); `n` > 1 repeats it."""
        import httpx

        body = {"q": texts, "source": self.source, "target": self.target, "format": "text"}
        if self.api_key:
            body["api_key"] = self.api_key
        for attempt in range(self.params.retries + 1):
            self._wait_for_slot()
            try:
                resp = self.client.post(self.endpoint, json=body)
            except httpx.TransportError as e:
                error = f"{type(e).__name__}"  # its message may hold the URL
            else:
                if resp.status_code == 200:
                    got = resp.json()["translatedText"]
                    got = got if isinstance(got, list) else [got]
                    return [[t] * n for t in got]
                if resp.status_code not in (429, 500, 502, 503, 504):
                    raise ZhpipeError(
                        f"translation service {self.name}: HTTP {resp.status_code} "
                        f"({resp.headers.get('content-type', 'no content type')}, "
                        f"{len(resp.content)} "
                        f"bytes)"
                    )
                error = f"HTTP {resp.status_code}"
                retry_after = resp.headers.get("Retry-After")
                if retry_after and retry_after.isdigit():
                    time.sleep(min(float(retry_after), 60))
            if attempt < self.params.retries:
                delay = min(0.5 * 2**attempt, 30)
                log.warning(
                    "translation service %s: %s; retry %d in %.1f s",
                    self.name,
                    error,
                    attempt + 1,
                    delay,
                )
                time.sleep(delay)
        raise ZhpipeError(
            f"translation service {self.name}: gave up after {self.params.retries + 1} attempts "
            f"({error})"
        )


class TranslationCache:
    """SQLite cache of translations keyed by (translator, direction, generation settings, text).

    Each batch is committed as soon as it is translated, so a killed stage keeps what it finished.
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, timeout=60, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS translations (key TEXT PRIMARY KEY, variants TEXT NOT NULL)"
        )
        self.db.commit()

    @staticmethod
    def key(namespace: str, text: str) -> str:
        return hashlib.sha256(f"{namespace}\x00{text}".encode()).hexdigest()

    def get_many(self, namespace: str, texts: list[str]) -> dict[str, list[str]]:
        keys = {self.key(namespace, t): t for t in texts}
        found: dict[str, list[str]] = {}
        items = list(keys)
        for i in range(0, len(items), 500):
            chunk = items[i : i + 500]
            rows = self.db.execute(
                f"SELECT key, variants FROM translations WHERE key IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
            found.update({keys[k]: json.loads(v) for k, v in rows})
        return found

    def put_many(self, namespace: str, pairs: dict[str, list[str]]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO translations VALUES (?, ?)",
            [(self.key(namespace, t), json.dumps(v, ensure_ascii=False)) for t, v in pairs.items()],
        )
        self.db.commit()

    def close(self) -> None:
        self.db.close()


class CachedTranslation:
    """Translates unique texts through a cache, in length-sorted batches; counts hits and misses."""

    def __init__(
        self,
        translator: Translator,
        cache: TranslationCache,
        direction: str,
        settings: dict,
        batch_size: int,
    ):
        self.translator, self.cache, self.batch_size = translator, cache, batch_size
        self.namespace = json.dumps(
            {"model": translator.name, "direction": direction, **settings}, sort_keys=True
        )
        self.hits = self.misses = 0

    def __call__(self, texts: list[str], n: int, progress=None) -> dict[str, list[str]]:
        unique = list(dict.fromkeys(texts))
        done = self.cache.get_many(self.namespace, unique)
        # similar lengths -> little padding
        todo = sorted((t for t in unique if t not in done), key=len)
        self.hits += len(unique) - len(todo)
        self.misses += len(todo)
        for i in range(0, len(todo), self.batch_size):
            batch = todo[i : i + self.batch_size]
            result = dict(zip(batch, self.translator.translate(batch, n)))
            self.cache.put_many(self.namespace, result)
            done.update(result)
            if progress is not None:
                progress.update(len(batch))
        return done
