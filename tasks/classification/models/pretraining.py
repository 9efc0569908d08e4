"""What BERT pretraining reads and reports: a text's clauses, sentence pairs for next-sentence
prediction (true next clauses and random ones), their encoding, and the masked-LM (and
next-sentence) metrics on validation."""

from __future__ import annotations

import numpy as np
import pandas as pd

CLAUSE_END = set("。！？!?；;，,")


def clauses(chars: str) -> list[list[str]]:
    """A text's clauses (characters up to and including each clause-ending punctuation mark); a text
    of one clause is cut in two halves, so that every text of two characters or more gives a
    pair."""
    tokens, out, current = chars.split(), [], []
    for t in tokens:
        current.append(t)
        if t in CLAUSE_END:
            out.append(current)
            current = []
    if current:
        out.append(current)
    if len(out) == 1 and len(tokens) >= 2:
        out = [tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]]
    return out


def sentence_pairs(texts: pd.Series, seed: int) -> list[tuple[list[str], list[str], int]]:
    """(A, B, label) per adjacent clause pair: label 0 = B follows A, 1 = B is a clause of another
    text (half each)."""
    rng = np.random.default_rng(seed)
    per_text = [c for c in (clauses(t) for t in texts) if len(c) >= 2]
    pairs = []
    for i, parts in enumerate(per_text):
        for a, b in zip(parts, parts[1:]):
            if len(per_text) > 1 and rng.random() < 0.5:
                j = int(rng.integers(len(per_text) - 1))
                other = per_text[j + (j >= i)]
                pairs.append((a, other[int(rng.integers(len(other)))], 1))
            else:
                pairs.append((a, b, 0))
    return pairs


def encode_pairs(tokenizer, pairs, max_len: int) -> list[dict]:
    """[CLS] A [SEP] B [SEP] with token types 0/1, each side cut to fit `max_len`."""
    room = max_len - 3
    out = []
    for a, b, label in pairs:
        a, b = (
            a[: max(room // 2, room - len(b))],
            b[: max(room // 2, room - min(len(a), room // 2))],
        )
        ids = tokenizer.convert_tokens_to_ids(["[CLS]", *a, "[SEP]", *b, "[SEP]"])
        out.append(
            {
                "input_ids": ids,
                "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1),
                "next_sentence_label": label,
            }
        )
    return out


def pretraining_metrics(m, batches, nsp: bool) -> dict[str, float]:
    """Masked-LM loss and perplexity over the masked characters of `batches` (and next-sentence loss
    and accuracy)."""
    import torch.nn.functional as F

    mlm = mlm_count = nsp_loss = nsp_right = rows = 0.0
    for masked_batch in batches:
        batch = {k: v.to(m.device) for k, v in masked_batch.items()}
        out = m(**batch)
        logits = out.prediction_logits if nsp else out.logits
        mask = batch["labels"] != -100
        mlm += F.cross_entropy(logits[mask].float(), batch["labels"][mask], reduction="sum").item()
        mlm_count += int(mask.sum())
        if nsp:
            nsp_loss += F.cross_entropy(
                out.seq_relationship_logits.float(), batch["next_sentence_label"], reduction="sum"
            ).item()
            nsp_right += (
                (out.seq_relationship_logits.argmax(1) == batch["next_sentence_label"]).sum().item()
            )
            rows += len(batch["labels"])
    loss = mlm / max(mlm_count, 1)
    metrics = {"val_mlm_loss": loss, "val_mlm_perplexity": float(np.exp(loss))}
    if nsp:
        metrics |= {
            "val_nsp_loss": nsp_loss / max(rows, 1),
            "val_nsp_accuracy": nsp_right / max(rows, 1),
        }
    return metrics
