"""Back-translation augmenter: Chinese -> pivot language -> Chinese, label kept,
quality-filtered."""

from __future__ import annotations

import logging

import pandas as pd

from tasks.classification.augmenters import AugmentContext, Augmented, eda, register
from tasks.classification.translators import (
    BackTranslationParams,
    CachedTranslation,
    HttpTranslator,
    PivotParams,
    RegisteredTranslator,
    Seq2SeqTranslator,
    TranslationCache,
    TranslationFilterParams,
    split_sentences,
)
from tasks.errors import ConfigError
from tasks.util.hub import ModelMissingError
from tasks.util.progress import progress
from tasks.util.segmenter import Segmenter

log = logging.getLogger("zhpipe.augment")
FILTER_REASONS = (
    "identical",
    "length_ratio",
    "too_similar",
    "too_dissimilar",
    "not_chinese",
    "duplicate",
)


def chinese_share(text: str) -> float:
    """Share of CJK ideographs among letters and ideographs (digits and punctuation do not
    count)."""
    cjk = sum("\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" for c in text)
    letters = sum(c.isalpha() for c in text)  # isalpha() is True for ideographs too
    return cjk / letters if letters else 0.0


def similarity(candidate: str, source: str) -> float:
    """chrF (character n-gram F-score, sacrebleu) of the candidate against the source, 0-1."""
    from sacrebleu.metrics import CHRF

    return CHRF().sentence_score(candidate, [source]).score / 100


def reject_reason(source: str, candidate: str, f: TranslationFilterParams, seen) -> str | None:
    """Why a back-translation is dropped, or None to keep it (checks in order, the first failing one
    counts)."""
    if candidate.strip() == source.strip():
        return "identical"
    ratio = len(candidate) / max(len(source), 1)
    if not f.min_length_ratio <= ratio <= f.max_length_ratio:
        return "length_ratio"
    if chinese_share(candidate) < f.min_chinese:
        return "not_chinese"
    sim = similarity(candidate, source)
    if sim > f.max_similarity:
        return "too_similar"
    if sim < f.min_similarity:
        return "too_dissimilar"
    if candidate in seen:
        return "duplicate"
    return None


def translators(pivot: PivotParams, p: BackTranslationParams, device: str, store=None):
    """(forward, backward) translators for one pivot language; `store` (tasks.core.StoreAccess)
    downloads a registered model and knows its spec (backend zhpipe)."""
    if p.backend == "http":
        return HttpTranslator(p.http, p.source_lang, pivot.lang), HttpTranslator(
            p.http, pivot.lang, p.source_lang
        )
    if p.backend == "zhpipe":
        refs = {"forward": pivot.forward, "backward": pivot.backward}
        for side, ref in refs.items():
            if not (ref or "").startswith("models:/"):
                raise ConfigError(
                    f"augment.backtranslation.pivots: pivot '{pivot.lang}' needs `{side}` as "
                    "models:/<name>@<alias> (a translator registered by a task: translation "
                    "pipeline) "
                    f"for backend zhpipe, not {ref!r}"
                )
        pair = tuple(
            RegisteredTranslator(*store.registered(refs[side]), store.model) for side in refs
        )
        wanted = (f"{p.source_lang}-{pivot.lang}", f"{pivot.lang}-{p.source_lang}")
        for side, translator, direction in zip(refs, pair, wanted):
            if translator.direction != direction:
                raise ConfigError(
                    f"augment.backtranslation.pivots: `{side}` {translator.name} translates "
                    f"{translator.direction}; the {side} model must translate {direction}"
                )
        return pair
    if not pivot.forward:
        raise ConfigError(
            f"augment.backtranslation.pivots: pivot '{pivot.lang}' needs `forward` (a model id or "
            f"folder) for the transformers backend"
        )
    forward = Seq2SeqTranslator(pivot.forward, p, device, pivot.source_code, pivot.pivot_code)
    backward = Seq2SeqTranslator(
        pivot.backward or pivot.forward, p, device, pivot.pivot_code, pivot.source_code
    )
    return forward, backward


def _settings(p: BackTranslationParams, n: int) -> dict:
    return {
        "max_length": p.max_length,
        "num_beams": p.num_beams,
        "do_sample": p.do_sample,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "n": n,
        "backend": p.backend,
    }


def round_trip(
    texts: list[str],
    pivot: PivotParams,
    p: BackTranslationParams,
    cache: TranslationCache,
    device: str,
    store=None,
):
    """Back-translate texts through one pivot: {text: (pivot text, [variants])}, plus cache
    counters."""
    forward, backward = translators(pivot, p, device, store)
    # texts per request / per generate()
    batch = p.http.batch_size if p.backend == "http" else p.batch_size
    to_pivot = CachedTranslation(
        forward, cache, f"{p.source_lang}-{pivot.lang}", _settings(p, 1), batch
    )
    from_pivot = CachedTranslation(
        backward, cache, f"{pivot.lang}-{p.source_lang}", _settings(p, p.num_variants), batch
    )
    pieces = {t: split_sentences(t, p.split_chars) for t in texts}
    all_pieces = [s for ps in pieces.values() for s in ps]
    with progress(
        total=len(set(all_pieces)),
        desc=f"{p.source_lang}->{pivot.lang}",
        unit="sent",
        leave=False,
        mininterval=2,
    ) as bar:
        pivoted = to_pivot(all_pieces, 1, bar)
    pivot_pieces = [pivoted[s][0] for s in all_pieces]
    with progress(
        total=len(set(pivot_pieces)),
        desc=f"{pivot.lang}->{p.source_lang}",
        unit="sent",
        leave=False,
        mininterval=2,
    ) as bar:
        back = from_pivot(pivot_pieces, p.num_variants, bar)
    out = {}
    for text, ps in pieces.items():
        pivot_text = " ".join(pivoted[s][0] for s in ps)
        variants = ["".join(back[pivoted[s][0]][k] for s in ps) for k in range(p.num_variants)]
        out[text] = (pivot_text, variants)
    counts = {
        "cache_hits": to_pivot.hits + from_pivot.hits,
        "cache_misses": to_pivot.misses + from_pivot.misses,
    }
    return out, counts, (forward.name, backward.name)


@register("backtranslation")
def backtranslation(train: pd.DataFrame, ctx: AugmentContext) -> Augmented:
    """Back-translate train rows through every pivot; keep the label; filter and count what is
    dropped."""
    p = ctx.params.backtranslation
    # a seeded random subset: the corpus may be sorted by label, so the first rows would all be one
    # class
    rows = (
        train.sample(n=min(p.max_rows, len(train)), random_state=ctx.params.seed).sort_values("id")
        if p.max_rows
        else train
    )
    cache = TranslationCache(ctx.cache_file)
    try:
        results = [
            (
                pivot,
                *round_trip(rows["text"].tolist(), pivot, p, cache, ctx.params.device, ctx.store),
            )
            for pivot in p.pivots
        ]
    except ModelMissingError as e:
        if ctx.params.fallback != "eda":
            raise
        log.warning("augment: %s; falling back to EDA (augment.fallback: eda)", e)
        result = eda(train, ctx)
        result.metrics["backtranslation_missing_model"] = 1
        return result
    finally:
        cache.close()
    # never add a copy of a train row, nor any held-out text
    seen = ctx.heldout.union(train["text"])
    new, sample = [], []
    metrics = {"candidates": 0, **{f"filtered_{r}": 0 for r in FILTER_REASONS}}
    for pivot, translated, counts, models in results:
        for key, value in counts.items():
            metrics[key] = metrics.get(key, 0) + value
        for row in rows.itertuples(index=False):
            pivot_text, variants = translated[row.text]
            for k, candidate in enumerate(variants):
                metrics["candidates"] += 1
                reason = reject_reason(row.text, candidate, p.filters, seen)
                if len(sample) < 500:
                    sample.append(
                        {
                            "source": row.text,
                            "pivot": pivot.lang,
                            "pivot_text": pivot_text,
                            "back_translation": candidate,
                            "kept": reason is None,
                            "reason": reason or "",
                        }
                    )
                if reason:
                    metrics[f"filtered_{reason}"] += 1
                    continue
                seen.add(candidate)
                new.append(
                    {
                        "text": candidate,
                        "label": getattr(row, "label", None),
                        "source_id": row.id,
                        "aug_method": "backtranslation",
                        "aug_index": k,
                        "pivot": pivot.lang,
                        "model_forward": models[0],
                        "model_backward": models[1],
                    }
                )
    new_rows = pd.DataFrame(new)
    if len(new_rows):
        seg = Segmenter(ctx.segment, ctx.root).rows(new_rows["text"].tolist())
        new_rows = new_rows.assign(**seg)
    total = metrics["cache_hits"] + metrics["cache_misses"]
    metrics["cache_hit_rate"] = metrics["cache_hits"] / total if total else 1.0
    return Augmented(new_rows, metrics, "backtranslation", pd.DataFrame(sample))
