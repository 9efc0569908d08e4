"""`zhpipe init`: a starter project folder with a pipelines.yaml for the user's CSV (or a small
example)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd

from flows.plan.project import CONFIG_NAME
from tasks.errors import ConfigError, DataError
from tasks.util.io import file_sha256
from tasks.util.private import NotOurs, atomic_path, foreign_link, own_folder, walk_links

GITIGNORE = "data/*\n!data/raw/\nmlruns/\n.prefect/\n"


def starters() -> dict:
    """Every kind's `zhpipe init --<option> PATH` starters, by option; the default kind's first is
    what a plain `zhpipe init` writes."""
    from tasks.stages import DEFAULT_KIND, KINDS

    kinds = [KINDS[DEFAULT_KIND], *(k for n, k in KINDS.items() if n != DEFAULT_KIND)]
    return {starter.option: starter for kind in kinds for starter in kind.starters}


def init_project(
    folder: Path,
    corpus: Path | None = None,
    option: str | None = None,
    link: bool = False,
    text_column: str = "text",
    label_column: str = "label",
    **fields: str,
) -> list[Path]:
    """Write pipelines.yaml into `folder` for `corpus`, as the kind's starter `option` says
    (tasks/<kind>/__init__.py; default: the default kind's first, a labelled CSV; `fields`: its
    options, comma-separated), and the starter's example corpus when none is given; never
    overwrite. The corpus is copied under data/raw/ (or, with `link`, linked there) and a file is
    pinned by its sha256, so the project can move or be shared, and an edited file is an error
    instead of silently another corpus. Each project gets its own pipeline, experiment and
    registered model, named after its folder."""
    every = starters()
    starter = every[option or next(iter(every))]
    config = _project_file(folder)
    folder = config.parent
    flag = f"--{starter.option}"
    if corpus is None:
        if starter.example is None:
            raise DataError(f"init {flag}: expected a corpus")
        path = folder / "data" / "raw" / "example.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        starter.example().to_csv(path, index=False)
        written, rows, pin = [path], None, ""
        text_column, label_column = "text", "label"
        description = "example hotel reviews (replace with your corpus)"
        where = path
    else:
        found = _followed(corpus, flag)
        written = _brought(starter, found, corpus, folder, link, (text_column, label_column))
        where = folder / "data" / "raw" / found.name if starter.folder else written[0]
        description = f"nightly files of {found.name}" if starter.folder else found.name
        rows, pin = None, ""
        if not starter.folder:  # one file: pinned, and a CSV sized for the template
            rows = _rows_about(where) if starter.columns else None
            pin = (
                f"      sha256: {file_sha256(where)}   # pinned: an edited file is an error "
                "(copy a new one, update this)\n"
            )
    shown = os.path.relpath(where, folder) + ("/*.csv" if starter.folder else "")
    values = starter.defaults() | fields
    lists = {
        k: json.dumps([c.strip() for c in v.split(",") if c.strip()]) for k, v in values.items()
    }
    # quoted: a file name with `#`, `: ` or quotes stays one YAML string (a JSON string is a YAML
    # one)
    text = starter.template.format(
        name=_name(folder),
        description=_quoted(description),
        path=_quoted(shown),
        sha256=pin,
        format=starter.format_of(where),
        text_column=_quoted(text_column),
        label_column=_quoted(label_column),
        **lists,
        **starter.sized(rows),
    )
    config.write_text(text, encoding="utf-8")
    written.append(config)
    return written + _ignore(folder)


def _brought(starter, found: Path, given: Path, folder: Path, link: bool, columns) -> list[Path]:
    """The corpus checked (a file, or a folder of CSV files; the columns the starter needs) and
    brought under the project's data/raw/."""
    flag = f"--{starter.option}"
    if starter.folder:
        files = sorted(p for p in found.glob("*.csv") if p.is_file()) if found.is_dir() else []
        for file in files:
            if why := foreign_link(file, found):
                raise DataError(
                    f"{flag} {file}: {why}; copy the file into {found} or remove the link"
                )
        if not files:
            raise DataError(
                f"{flag} {found}: expected a folder of CSV files (one per night), found none"
            )
        header, shown = files[0], files[0]
    else:
        if not found.is_file():
            raise DataError(f"{flag} {given}: no such file")
        files, header, shown = [found], found, given
    if starter.columns:
        names = _columns(header, shown)
        for what, column in zip(starter.columns, columns):
            if column not in names:
                raise DataError(
                    f"{flag} {shown}: no {what} column '{column}' (columns: {', '.join(names)}); "
                    f"name it with --{what}-column"
                )
    raw = folder / "data" / "raw" / (found.name if starter.folder else "")
    return [_bring(f, raw, link) for f in files]


def _ignore(folder: Path) -> list[Path]:
    ignore = folder / ".gitignore"
    if ignore.exists():
        return []
    ignore.write_text(GITIGNORE, encoding="utf-8")
    return [ignore]


def _rows_about(path: Path) -> int:
    """About how many rows a CSV holds, from its size and its first 2,000 rows' (the template's
    choices need no more than a rough figure; a gigabyte file is not read through)."""
    import pandas as pd

    head = pd.read_csv(path, dtype=str, nrows=2000, encoding_errors="replace")
    if len(head) < 2000:
        return len(head)
    with open(path, "rb") as f:
        # the header and about 2,000 rows' bytes
        start = sum(len(f.readline()) for _ in range(2001))
    return int(2000 * path.stat().st_size / max(start, 1))


def _project_file(folder: Path) -> Path:
    """The new project's pipelines.yaml: in a folder of this user's, made 0700 (`own_folder`: a link
    another user planted at DIR is refused, not followed), with no pipelines.yaml yet."""
    try:
        root = own_folder(folder)
    except NotOurs as e:
        raise ConfigError(f"init {folder}: {e}; choose a folder of your own") from None
    config = root / CONFIG_NAME
    if config.exists():
        raise ConfigError(f"{config} already exists; zhpipe init writes a new project only")
    return config


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


# init reads this much of a CSV at most: its header line must fit (a run bounds the rest)
HEADER_BYTES = 1 << 20
SAMPLE_ROWS = 200  # rows of that head parsed, so that a broken file is said at init


def _columns(path: Path, shown: Path) -> list[str]:
    """The CSV's header, read in its own encoding (UTF-8, UTF-16 or GB18030/GBK, detected as a run
    does) from its first megabyte only: a file of any size or width costs init the same."""
    import csv
    import io

    from tasks.source.readers import detect_encoding

    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES + 1)
    whole = len(head) <= HEADER_BYTES
    head = head[:HEADER_BYTES]
    encoding = detect_encoding(head, path)
    try:
        text = head.decode(encoding, errors="strict" if whole else "ignore").lstrip("\ufeff")
    except (UnicodeDecodeError, LookupError) as e:
        raise DataError(
            f"--csv {shown}: not a readable CSV in {encoding} ({str(e).splitlines()[0][:120]})"
        ) from None
    if not whole:
        text = text[: text.rfind("\n") + 1]
        if not text:
            raise DataError(
                f"--csv {shown}: its header line is longer than {HEADER_BYTES >> 20} MB (expected "
                "a CSV "
                f"whose first line names its columns, such as text,label)"
            )
    try:
        header = next(csv.reader(io.StringIO(text)), [])
        # a bounded sample of rows: a broken quote or a row of the wrong width is said now, not
        # mid-run
        if header:
            pd.read_csv(io.StringIO(text), nrows=SAMPLE_ROWS, dtype=str)
    except (csv.Error, ValueError, pd.errors.ParserError) as e:
        raise DataError(
            f"--csv {shown}: not a readable CSV in {encoding} ({str(e).splitlines()[0][:120]})"
        ) from None
    if not header:
        raise DataError(
            f"--csv {shown}: empty (expected a header line naming its columns, such as text,label)"
        )
    return header


def _followed(path: Path, option: str) -> Path:
    """`path`'s real path, every link on the way checked before it is followed (`walk_links`): one
    line naming a link another user made."""
    try:
        return walk_links(path.expanduser())
    except OSError as e:
        raise DataError(f"{option} {path}: {e.strerror}") from None


def _bring(source: Path, raw: Path, link: bool) -> Path:
    """`source` under `raw/`: copied (atomically), or a symlink with `link`; a file already there is
    used."""
    raw.mkdir(parents=True, exist_ok=True)
    if why := foreign_link(source, source.parent):
        raise DataError(f"{source}: {why}; copy the file itself")
    target = raw / source.name
    if target.resolve() == source:
        return target
    if target.exists() or target.is_symlink():
        raise ConfigError(f"{target} already exists; remove it or pass a CSV with another name")
    if link:
        target.symlink_to(source)
        return target
    with atomic_path(target) as tmp:  # owner-only, and nothing left behind when the disk fills
        shutil.copyfile(source, tmp)
    return target


def _name(folder: Path) -> str:
    """A pipeline name from the folder's name: letters, digits, dashes."""
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in folder.name.lower()).strip("-_")
    return name or "main"
