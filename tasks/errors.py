"""Errors that zhpipe reports as one line, without a traceback (the CLI prints them; the API raises them)."""


class ZhpipeError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(ZhpipeError):
    """pipelines.yaml or a command-line override is invalid."""


class DataError(ZhpipeError):
    """The corpus is missing, unreadable, or does not have the expected shape."""
