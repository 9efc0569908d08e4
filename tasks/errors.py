"""Errors that zhpipe reports as one line, without a traceback (the CLI prints them; the API raises them)."""


class ZhpipeError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(ZhpipeError):
    """pipelines.yaml or a command-line override is invalid."""


class DataError(ZhpipeError):
    """The corpus is missing, unreadable, or does not have the expected shape."""


def say(kind: str, message: str = "") -> None:
    """`zhpipe: <kind>: <message>` on stderr, on a line of its own even where stdout and stderr go to one file (a cron
    log): stdout's buffered lines are written first, so the line never lands in the middle of one of theirs."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    print(f"zhpipe: {kind}" + (f": {message}" if message else ""), file=sys.stderr, flush=True)
