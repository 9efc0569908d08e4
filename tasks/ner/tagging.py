"""Sequence labelling: tag schemes, spans and the readers of tagged corpora. Every scheme is read
into BIOES (B- begin, I- inside, E- end, S- single, O outside); spans are (type, start, end) with
`end` exclusive, in characters of the text. Light imports: pool workers and the served model import
this module."""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np


def split_tag(tag: str) -> tuple[str, str]:
    """("B", "ORG") for "B-ORG" (also "B_ORG"); ("O", "") for "O"."""
    if tag == "O":
        return "O", ""
    for sep in ("-", "_"):
        prefix, found, kind = tag.partition(sep)
        if found and prefix and kind:
            return prefix.upper(), kind
    return tag, ""


def detect_scheme(tags: list[str]) -> str:
    """bmes when an M- tag occurs, bioes when an E- or S- tag does, else bio."""
    prefixes = {split_tag(t)[0] for t in tags}
    if "M" in prefixes:
        return "bmes"
    if prefixes & {"E", "S"}:
        return "bioes"
    return "bio"


def valid_tag(tag: str, scheme: str) -> bool:
    prefix, kind = split_tag(tag)
    allowed = {"bio": "BI", "bioes": "BIES", "bmes": "BMES"}[scheme]
    return tag == "O" or (prefix in allowed and len(prefix) == 1 and bool(kind))


def spans_from(tags: list[str], scheme: str) -> tuple[list[tuple[str, int, int]], str | None]:
    """Entity spans of one sentence's tags in `scheme`, and the first ill-formed position as a
    message (None when well formed). BIO is read leniently (an I- after O or another type starts an
    entity, as in IOB1); BIOES and BMES strictly (an entity must begin with B- and end with E-, or
    be one S-)."""
    spans: list[tuple[str, int, int]] = []
    if scheme == "bio":
        start, kind = None, ""
        for i, tag in enumerate(list(tags) + ["O"]):
            prefix, k = split_tag(tag)
            if start is not None and (prefix in ("B", "O") or k != kind):
                spans.append((kind, start, i))
                start = None
            if prefix == "B" or (prefix == "I" and start is None):
                start, kind = i, k
        return spans, None
    inside = "M" if scheme == "bmes" else "I"
    start, kind = None, ""
    for i, tag in enumerate(tags):
        prefix, k = split_tag(tag)
        if start is not None and (prefix not in (inside, "E") or k != kind):
            return (
                spans,
                f"entity {kind} opened at character {start + 1} is not closed before {tag!r} at "
                "character "
                f"{i + 1}",
            )
        if prefix == "S":
            spans.append((k, i, i + 1))
        elif prefix == "B":
            start, kind = i, k
        elif prefix == "E":
            spans.append((kind, start, i + 1))
            start = None
        elif prefix == inside and start is None:
            return spans, f"{tag!r} at character {i + 1} continues no entity"
    if start is not None:
        return (
            spans,
            f"entity {kind} opened at character {start + 1} is not closed at the end of the "
            "sentence",
        )
    return spans, None


def spans_of(tags: list[str]) -> list[tuple[str, int, int]]:
    """Well-formed entity spans of BIOES tags (strict: a chunk that is not well formed is no entity,
    as seqeval's strict mode counts it)."""
    spans, start, kind = [], None, ""
    for i, tag in enumerate(tags):
        prefix, k = split_tag(tag)
        if prefix == "S":
            spans.append((k, i, i + 1))
            start = None
        elif prefix == "B":
            start, kind = i, k
        elif prefix == "I":
            if start is None or k != kind:
                start = None
        elif prefix == "E":
            if start is not None and k == kind:
                spans.append((kind, start, i + 1))
            start = None
        else:
            start = None
    return spans


def span_counts(gold: list[list[str]], pred: list[list[str]]) -> tuple[Counter, Counter, Counter]:
    """True positives, false positives and false negatives per entity type, strict span matching
    (seqeval's strict mode)."""
    tp, fp, fn = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred):
        gs, ps = set(spans_of(list(g))), set(spans_of(list(p)))
        tp.update(k for k, _, _ in gs & ps)
        fp.update(k for k, _, _ in ps - gs)
        fn.update(k for k, _, _ in gs - ps)
    return tp, fp, fn


def prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts (0 where undefined)."""
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def bioes(spans: list[tuple[str, int, int]], length: int) -> list[str]:
    """BIOES tags of `length` characters holding `spans` (non-overlapping)."""
    tags = ["O"] * length
    for kind, start, end in spans:
        if end - start == 1:
            tags[start] = f"S-{kind}"
            continue
        tags[start] = f"B-{kind}"
        for i in range(start + 1, end - 1):
            tags[i] = f"I-{kind}"
        tags[end - 1] = f"E-{kind}"
    return tags


def tag_set(kinds: list[str]) -> list[str]:
    """Every BIOES tag of the entity types, O first."""
    return ["O"] + [f"{p}-{k}" for k in kinds for p in "BIES"]


def transitions(tags: list[str]) -> tuple[list[list[bool]], list[bool], list[bool]]:
    """Which tag may follow which in BIOES, and which may start or end a sentence."""

    def ok(a: str, b: str) -> bool:
        pa, ka = split_tag(a)
        pb, kb = split_tag(b)
        if pa in ("B", "I"):
            return pb in ("I", "E") and ka == kb
        return pb in ("O", "B", "S")

    starts = [split_tag(t)[0] in ("O", "B", "S") for t in tags]
    ends = [split_tag(t)[0] in ("O", "E", "S") for t in tags]
    return [[ok(a, b) for b in tags] for a in tags], starts, ends


@dataclass
class Sentence:
    """One sentence read from a tagged file: its text, BIOES tags per character and first line."""

    text: str
    tags: list[str]
    line: int
    split: str | None = None


@dataclass
class TaggedFile:
    sentences: list[Sentence] = field(default_factory=list)
    bad: list[dict] = field(default_factory=list)  # {line, reason, raw}
    scheme: str = ""
    physical: int = 0


def _to_chars(tokens: list[str], tags: list[str], scheme: str) -> tuple[str, list[str], str | None]:
    """Token-level tags to character-level BIOES (a token of several characters, such as "2012" in
    some corpora, gives its characters the entity it belongs to)."""
    spans, problem = spans_from(tags, scheme)
    if problem:
        return "", [], problem
    offsets, pos = [], 0
    for token in tokens:
        offsets.append(pos)
        pos += len(token)
    offsets.append(pos)
    return "".join(tokens), bioes([(k, offsets[s], offsets[e]) for k, s, e in spans], pos), None


def parse_conll(lines: list[str], scheme: str = "auto") -> TaggedFile:
    """CoNLL-style `token TAG` lines (space or tab; the tag is the last field), a blank line between
    sentences. A sentence with a malformed line or ill-formed tags is quarantined whole, with the
    line and the reason; `scheme` auto is detected from the whole file's tags."""
    raw: list[tuple[int, list[tuple[int, str, str]]]] = []
    bad: list[dict] = []
    current: list[tuple[int, str, str]] = []
    broken: dict | None = None

    def close(at: int) -> None:
        nonlocal current, broken
        if broken:
            bad.append(broken)
        elif current:
            raw.append((current[0][0], current))
        current, broken = [], None

    for number, line in enumerate(lines, 1):
        if not line.strip():
            close(number)
            continue
        if line.startswith("-DOCSTART-"):
            continue
        fields = line.split("\t") if "\t" in line else line.split(" ")
        fields = [f for f in fields if f != ""] if "\t" not in line else [f.strip() for f in fields]
        if len(fields) < 2 or not fields[0] or not fields[-1]:
            broken = broken or {"line": number, "reason": "expected 'token TAG'", "raw": line[:500]}
        else:
            current.append((number, fields[0], fields[-1].strip()))
    close(len(lines) + 1)
    found = (
        scheme if scheme != "auto" else detect_scheme([t for _, rows in raw for _, _, t in rows])
    )
    out = TaggedFile(bad=bad, scheme=found, physical=len(lines))
    for start, rows in raw:
        wrong = next(((n, t) for n, _, t in rows if not valid_tag(t, found)), None)
        if wrong:
            out.bad.append(
                {
                    "line": wrong[0],
                    "reason": f"tag {wrong[1]!r} is not a {found.upper()} tag",
                    "raw": wrong[1],
                }
            )
            continue
        text, tags, problem = _to_chars([tok for _, tok, _ in rows], [t for _, _, t in rows], found)
        if problem:
            out.bad.append(
                {"line": start, "reason": problem, "raw": "".join(tok for _, tok, _ in rows)[:500]}
            )
            continue
        out.sentences.append(Sentence(text, tags, start))
    out.bad.sort(key=lambda b: b["line"])
    return out


SPAN_KEYS = ("entities", "spans", "labels", "label")


def _span(item) -> tuple[str, int, int]:
    """One span from {"start", "end", "type"|"label"} or [start, end, type]."""
    if isinstance(item, dict):
        kind = item.get("type", item.get("label"))
        start, end = (
            item.get("start", item.get("start_offset")),
            item.get("end", item.get("end_offset")),
        )
    elif isinstance(item, (list, tuple)) and len(item) == 3:
        start, end, kind = item
    else:
        raise ValueError("expected {start, end, type} or [start, end, type]")
    if (
        not isinstance(start, int)
        or not isinstance(end, int)
        or not isinstance(kind, str)
        or not kind
    ):
        raise ValueError("start and end must be integers and the type a string")
    return kind, start, end


def parse_span_jsonl(lines: list[str], text_key: str = "text") -> TaggedFile:
    """JSONL with one sentence per line: {"text": ..., "entities": [{"start", "end", "type"}, ...]}
    (also `spans`/`labels`, or [start, end, type] items; `end` exclusive)."""
    out = TaggedFile(scheme="spans", physical=len(lines))
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get(text_key), str):
                raise ValueError(f"expected an object with a string {text_key!r}")
            text = row[text_key]
            items = next((row[k] for k in SPAN_KEYS if k in row), [])
            spans = sorted(_span(item) for item in items)
            spans.sort(key=lambda s: s[1])
            for kind, start, end in spans:
                if not 0 <= start < end <= len(text):
                    raise ValueError(
                        f"span {kind} [{start}, {end}) is outside the text of {len(text)} "
                        "characters"
                    )
            for (k1, _, e1), (k2, s2, _) in zip(spans, spans[1:]):
                if s2 < e1:
                    raise ValueError(f"spans {k1} and {k2} overlap at character {s2 + 1}")
        except ValueError as e:
            out.bad.append(
                {"line": number, "reason": str(e).split("\n")[0][:200], "raw": line[:500]}
            )
            continue
        if text:
            out.sentences.append(Sentence(text, bioes(spans, len(text)), number))
    return out


POSITIONS = {"B": 1, "M": 2, "E": 3}  # a character's place in a covering word; 0 = padding


class Lexicon:
    """Lexicon words (id 0 is padding) and their matches in a text."""

    def __init__(self, words: list[str], max_words: int = 6):
        self.index = {w: i + 1 for i, w in enumerate(words)}
        self.longest = max((len(w) for w in words), default=1)
        self.max_words = max_words

    def __len__(self) -> int:
        return len(self.index) + 1

    def match(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(word ids, positions) per character, (len(text), max_words) each: the words of two or
        more characters that cover it, longest first."""
        found: list[list[tuple[int, int, int]]] = [[] for _ in text]
        for i in range(len(text)):
            for n in range(2, min(self.longest, len(text) - i) + 1):
                wid = self.index.get(text[i : i + n])
                if wid is None:
                    continue
                for j in range(i, i + n):
                    place = (
                        POSITIONS["B"]
                        if j == i
                        else POSITIONS["E"]
                        if j == i + n - 1
                        else POSITIONS["M"]
                    )
                    found[j].append((n, wid, place))
        ids = np.zeros((len(text), self.max_words), dtype=np.int64)
        places = np.zeros((len(text), self.max_words), dtype=np.int64)
        for j, words in enumerate(found):
            for k, (_, wid, place) in enumerate(sorted(words, reverse=True)[: self.max_words]):
                ids[j, k], places[j, k] = wid, place
        return ids, places


def bigrams(text: str) -> tuple[list[str], list[str]]:
    """Each character's bigram with the next and with the previous character."""
    padded = "\x02" + text + "\x03"
    return [padded[i + 1 : i + 3] for i in range(len(text))], [
        padded[i : i + 2] for i in range(len(text))
    ]


SEG = {"B": 1, "M": 2, "E": 3, "S": 4}  # a character's place in jieba's word; 0 = padding


def word_places(words: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Per character of the segmented text: its place in its word (B, M, E, or S for a one-character
    word) and the word's POS tag."""
    places, flags = [], []
    for word, flag in words:
        n = len(word)
        places += ["S"] if n == 1 else ["B"] + ["M"] * (n - 2) + ["E"]
        flags += [flag] * n
    return places, flags


def word_features(
    words: list[tuple[str, str]], pos_index: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """word_places as ids: SEG per character and the POS tag id (1 = unknown)."""
    places, flags = word_places(words)
    return (
        np.array([SEG[p] for p in places], dtype=np.int64),
        np.array([pos_index.get(f, 1) for f in flags], dtype=np.int64),
    )


def marked(text: str, tags: list[str]) -> str:
    """The text with its entities in brackets: [王小明|NAME]."""
    out, last = [], 0
    for kind, start, end in spans_of(list(tags)):
        out += [text[last:start], f"[{text[start:end]}|{kind}]"]
        last = end
    return "".join(out + [text[last:]])


def highlighted(text: str, tags: list[str]) -> str:
    """HTML with each entity as a <mark> titled by its type."""
    out, last = [], 0
    for kind, start, end in spans_of(list(tags)):
        out += [
            html.escape(text[last:start]),
            f'<mark title="{html.escape(kind)}">{html.escape(text[start:end])}'
            f"<sub>{html.escape(kind)}</sub></mark>",
        ]
        last = end
    return "".join(out + [html.escape(text[last:])])
