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


def _templates():
    """The default kind's `zhpipe init` templates (a labelled CSV, nightly files) and example
    corpus."""
    from tasks.stages import DEFAULT_KIND, KINDS

    return KINDS[DEFAULT_KIND].init


def starters() -> dict:
    """The kinds' `zhpipe init --<option> FILE` starters, by option."""
    from tasks.stages import KINDS

    return {kind.starter.option: kind.starter for kind in KINDS.values() if kind.starter}


def init_corpus(
    folder: Path,
    corpus: Path,
    option: str,
    link: bool = False,
    text_column: str = "text",
    label_column: str = "label",
    **fields: str,
) -> list[Path]:
    """A starter project for a corpus that is not one labelled CSV: `nightly` (a folder of nightly
    CSV files, linked or copied into data/raw/<folder>/), or one file of a kind's starter (`--ner`,
    `--pairs`: tasks/<kind>/__init__.py; `fields`: its options, comma-separated). Each gets its own
    pipeline, experiment and registered model, named after the project folder."""
    config = _project_file(folder)
    folder = config.parent
    corpus = _followed(corpus, f"--{option}")
    if option == "nightly":
        files = sorted(p for p in corpus.glob("*.csv") if p.is_file()) if corpus.is_dir() else []
        for file in files:
            if why := foreign_link(file, corpus):
                raise DataError(
                    f"--nightly {file}: {why}; copy the file into {corpus} or remove the link"
                )
        if not files:
            raise DataError(
                f"--nightly {corpus}: expected a folder of CSV files (one per night), found none"
            )
        for what, column in (("text", text_column), ("label", label_column)):
            if column not in _columns(files[0], files[0]):
                raise DataError(
                    f"--nightly {files[0]}: no {what} column '{column}' (columns: "
                    f"{', '.join(_columns(files[0], files[0]))}); name it with --{what}-column"
                )
        written = [_bring(f, folder / "data" / "raw" / corpus.name, link) for f in files]
        text = _templates().nightly.format(
            name=_name(folder),
            description=_quoted(f"nightly files of {corpus.name}"),
            path=_quoted(f"data/raw/{corpus.name}/*.csv"),
            text_column=_quoted(text_column),
            label_column=_quoted(label_column),
        )
    else:
        starter = starters()[option]
        if not corpus.is_file():
            raise DataError(f"--{option} {corpus}: no such file")
        path = _bring(corpus, folder / "data" / "raw", link)
        written = [path]
        pin = (
            f"      sha256: {file_sha256(path)}   # pinned: an edited file is an error (copy a new "
            "one, update "
            f"this)\n"
        )
        values = {
            flag.removeprefix("--").replace("-", "_"): default
            for flag, default, _ in starter.options
        } | fields
        lists = {
            k: json.dumps([c.strip() for c in v.split(",") if c.strip()]) for k, v in values.items()
        }
        text = starter.template.format(
            name=_name(folder),
            description=_quoted(corpus.name),
            path=_quoted(os.path.relpath(path, folder)),
            sha256=pin,
            format=starter.format_of(corpus),
            **lists,
        )
    config.write_text(text, encoding="utf-8")
    written.append(config)
    return written + _ignore(folder)


def _ignore(folder: Path) -> list[Path]:
    ignore = folder / ".gitignore"
    if ignore.exists():
        return []
    ignore.write_text(GITIGNORE, encoding="utf-8")
    return [ignore]


def init_project(
    folder: Path,
    csv: Path | None = None,
    text_column: str = "text",
    label_column: str = "label",
    link: bool = False,
) -> list[Path]:
    """Write pipelines.yaml (and an example corpus when no CSV is given) into `folder`; never
    overwrite. A user's CSV is copied under data/raw/ (or, with `link`, linked there) and pinned by
    its sha256, so the project can move or be shared, and an edited file is an error instead of
    silently another corpus."""
    config = _project_file(folder)
    folder = config.parent
    written = []
    if csv is None:
        path = folder / "data" / "raw" / "example.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        _templates().example().to_csv(path, index=False)
        written.append(path)
        text_column, label_column, description = (
            "text",
            "label",
            "example hotel reviews (replace with your corpus)",
        )
    else:
        path = _followed(csv, "--csv")
        if not path.is_file():
            raise DataError(f"--csv {csv}: no such file")
        columns = _columns(path, csv)
        for what, column in (("text", text_column), ("label", label_column)):
            if column not in columns:
                raise DataError(
                    f"--csv {csv}: no {what} column '{column}' (columns: {', '.join(columns)}); "
                    f"name it with --{what}-column"
                )
        description = f"{path.name}"
        path = _bring(path, folder / "data" / "raw", link)
        written.append(path)
    pin = (
        ""
        if csv is None
        else f"      sha256: {file_sha256(path)}   # pinned: an edited file is an error (copy a "
        f"new one, update this)\n"
    )
    shown = os.path.relpath(path, folder) if path.is_relative_to(folder) else str(path)
    # quoted: a file name with `#`, `: ` or quotes stays one YAML string (a JSON string is a YAML
    # one)
    templates = _templates()
    config.write_text(
        templates.csv.format(
            name=_name(folder),
            description=_quoted(description),
            path=_quoted(shown),
            text_column=_quoted(text_column),
            label_column=_quoted(label_column),
            sha256=pin,
            **templates.sized(None if csv is None else _rows_about(path)),
        ),
        encoding="utf-8",
    )
    written.append(config)
    return written + _ignore(folder)


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
