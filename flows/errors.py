"""Errors that the CLI reports as one line, without a traceback."""


class ZhpipeError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class ConfigError(ZhpipeError):
    """pipelines.yaml or a command-line override is invalid."""


class DataError(ZhpipeError):
    """The corpus is missing, unreadable, or does not have the expected shape."""
