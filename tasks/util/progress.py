"""Progress for long work: a bar where a person watches (stderr is a terminal); in a log (a cron
job's, a worker's), a line every `LOG_EVERY` seconds while the work lasts (none for work shorter
than that)."""

from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm

LOG_EVERY = 30.0  # seconds between a long piece of work's lines in a log
log = logging.getLogger("zhpipe.progress")


class LogLines:
    """The part of tqdm's interface the stages use, written as a log line every `LOG_EVERY`
    seconds."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it", **_):
        self.total, self.desc, self.unit, self.n, self.postfix = total, desc, unit, 0, ""
        self.started = self.said = time.monotonic()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.said >= LOG_EVERY:
            self.said = now
            of = f"/{self.total:,.0f}" if self.total else ""
            share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
            log.info(
                "%s: %s%s %s%s after %.0f s%s",
                self.desc,
                f"{self.n:,.0f}",
                of,
                self.unit,
                share,
                now - self.started,
                f", {self.postfix}" if self.postfix else "",
            )

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(*, shown: bool = True, **kwargs) -> tqdm | LogLines:
    """A tqdm bar on stderr when it is a terminal and `shown`; else log lines every `LOG_EVERY`
    seconds."""
    if shown and sys.stderr.isatty():
        return tqdm(**kwargs)
    return LogLines(**kwargs)
