"""Values as zhpipe reads them: YAML within limits (aliases expanded at most MAX_YAML_NODES nodes),
`--set` lines, the strings inside a value, cron lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tasks.errors import ConfigError

_CRON_FIELDS = (
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (
        1,
        12,
        {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    ),
    (0, 7, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}),
)


def valid_cron(line: str) -> bool:
    """A standard five-field cron line (numbers, names, `*`, ranges, lists, steps), checked without
    importing Prefect (whose server checks it again at deploy time)."""
    fields = line.split()
    if len(fields) != 5:
        return False
    for text, (lo, hi, names) in zip(fields, _CRON_FIELDS):
        for item in text.lower().split(","):
            span, _, step = item.partition("/")
            if step and not (step.isdigit() and int(step) > 0):
                return False
            if span == "*":
                continue
            bounds = span.split("-")
            if len(bounds) > 2:
                return False
            values = [names.get(b, int(b) if b.isdigit() else None) for b in bounds]
            if any(v is None or not lo <= v <= hi for v in values) or (
                len(values) == 2 and values[0] > values[1]
            ):
                return False
    return True


def apply_set(raw: dict, assignment: str) -> None:
    """Apply one `--set section.key=value` to the raw pipeline dict."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected STAGE.PARAM=VALUE")
    dotted, value = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    value = parse_value(value)
    if parts[-1].endswith("_env") or any(k.endswith("_env") for k in mapping_keys(value)):
        raise ConfigError(
            f"--set {dotted.strip()}: names of environment variables holding secrets are declared "
            "in "
            f"pipelines.yaml, not in overrides"
        )
    if len(parts) < 2:
        raise ConfigError(f"--set {assignment!r}: expected STAGE.PARAM=VALUE (e.g. train.epochs=2)")
    node = (
        raw.setdefault("source", {})
        if parts[0] == "source"
        else raw.setdefault("stages", {}).setdefault(parts[0], {})
    )
    for part in parts[1:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: '{part}' is not a section")
    node[parts[-1]] = value


MAX_YAML_NODES = 200_000  # a config expanded (aliases followed) beyond this is refused, not built
# a pipelines.yaml is a few kB; one of megabytes holds a pasted corpus, not settings
MAX_CONFIG_BYTES = 1 << 20


def read_config(path: Path | str) -> Any:
    """A config file's YAML: at most MAX_CONFIG_BYTES of UTF-8, parsed by `load_yaml`; a file too
    large, not UTF-8, unreadable or nested too deep is one line naming it."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size / 2**20:.1f} MB, and a config file is at most "
                f"{MAX_CONFIG_BYTES >> 10} kB (settings, not data: is a corpus pasted into it?)"
            )
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"
        ) from None
    try:
        return load_yaml(text, path)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {' '.join(str(e).split())[:300]}") from None


def load_yaml(text: str, where: Path | str = "--set value") -> Any:
    """`yaml.safe_load` that refuses a document whose aliases expand past MAX_YAML_NODES nodes (a
    few hundred bytes of nested aliases can otherwise take gigabytes), counted on the composed graph
    before it is built."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(
                f"{where}: YAML nested too deep (lists or mappings inside each other thousands of "
                f"levels down); a config is a few levels deep"
            ) from None
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def size(n) -> int:
            if id(n) in sizes:
                return sizes[id(n)]
            sizes[id(n)] = 1  # a cycle counts once
            children = (
                [c for pair in n.value for c in pair]
                if isinstance(n, yaml.MappingNode)
                else n.value
                if isinstance(n, yaml.SequenceNode)
                else []
            )
            total = 1 + sum(size(c) for c in children)
            sizes[id(n)] = total
            return total

        try:
            expanded = size(node)
        except RecursionError:
            raise ConfigError(
                f"{where}: YAML nested too deep; a config is a few levels deep"
            ) from None
        if expanded > MAX_YAML_NODES:
            raise ConfigError(
                f"{where}: YAML aliases expand to {expanded:,} nodes (at most {MAX_YAML_NODES:,}); "
                "is an alias nested in itself?"
            )
        try:
            return loader.construct_document(node)
        except RecursionError:
            raise ConfigError(
                f"{where}: YAML nested too deep; a config is a few levels deep"
            ) from None
    finally:
        loader.dispose()


def parse_value(value: str) -> Any:
    """An override's value as the config reads it: lists, mappings and null are YAML (escapes and
    all); scalars stay strings and pydantic converts them to the field's type, so
    `source.sha256=0123...` stays a string instead of becoming the number 123..."""
    text = value.strip()
    if not (text[:1] in "[{" or text in ("null", "~")):
        return text
    if len(text) > 10_000:
        raise ConfigError(f"--set value of {len(text)} characters: at most 10000")
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(
            f"--set value {text[:60]!r}: invalid YAML ({str(e).splitlines()[0]})"
        ) from None


def value_strings(value: Any):
    """(is a mapping key, text) for every string inside a parsed value, keys and values, at any
    depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield True, str(k)
            yield from value_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from value_strings(v)
    elif value is not None:
        yield False, str(value)


def mapping_keys(value: Any):
    """Every mapping key inside a parsed value, at any depth."""
    return (text for is_key, text in value_strings(value) if is_key)


def string_leaves(value: Any):
    """Every string inside a parsed value (keys and values, at any depth)."""
    return (text for _, text in value_strings(value))
