"""Progress bars for long work: drawn where a person watches (stderr is a terminal), left out of a log file (a cron
job's, a worker's), where every epoch and stage already writes a line of its own."""
from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress(*, shown: bool = True, **kwargs) -> tqdm:
    """A tqdm bar on stderr when it is a terminal and `shown`; else a silent one (its updates cost nothing)."""
    return tqdm(disable=not shown or not sys.stderr.isatty(), **kwargs)
