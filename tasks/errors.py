"""Errors that zhpipe reports as one line, without a traceback (the CLI prints them; the API raises
them)."""


class ZhpipeError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(ZhpipeError):
    """pipelines.yaml or a command-line override is invalid."""


class DataError(ZhpipeError):
    """The corpus is missing, unreadable, or does not have the expected shape."""


_CONTROL = {
    c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)
}


def printable(text: str) -> str:
    """`text` safe for a terminal: the control characters a corpus or a config may hold (ESC, C1
    controls such as CSI, carriage returns) written as `\\xNN`, so that data can neither move the
    cursor nor recolour the screen."""
    return str(text).translate(_CONTROL)


def say(kind: str, message: str = "") -> None:
    """`zhpipe: <kind>: <message>` on stderr, on a line of its own even where stdout and stderr go
    to one file (a cron log): stdout's buffered lines are written first, so the line never lands in
    the middle of one of theirs."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    print(
        f"zhpipe: {kind}" + (f": {printable(message)}" if message else ""),
        file=sys.stderr,
        flush=True,
    )
