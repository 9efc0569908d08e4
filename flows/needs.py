"""What a command needs before it runs (a project, free space, a Prefect server, the warm process),
declared with its parser by the commands (flows/cli, flows/runtime/commands.py) and provided by the
entry point: below both rooms, so that neither imports the other for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Needs:
    """What a command needs before it runs, declared with its parser
    (`set_defaults(needs=Needs(...))`) and provided by the entry point (flows/cli/__init__.py, with
    the runtime in flows/runtime); a command that declares nothing needs its project folder only."""

    project: bool = True  # a project folder (`init` makes one)
    space: bool = False  # it writes: free disk space is checked first
    # "use": the project's running background Prefect server; "start": start one when none runs
    server: str = ""
    # runs Prefect flows here: with no server to use, a temporary one starts with the command
    flows: bool = False
    warm: bool = False  # short-lived, reads a pipeline: handed to the warm process when one runs
    leaves_warm: bool = False  # leaves a warm process beside the server for the next commands
    watched: bool = False  # the background server lost mid-way stops it in one line
    prefect: bool = False  # Prefect's loggers set up (tracebacks of zhpipe's own errors quieted)
    # what an interrupted command leaves for the next (said on Ctrl-C and when the server is lost)
    keeps: str = ""

    def of(self, args) -> Needs:
        """These needs for one invocation: a command run on Dask talks to the Prefect server and is
        never handed over."""
        from dataclasses import replace

        if not getattr(args, "dask", None):
            return self
        return replace(self, server=self.server or "use", warm=False, prefect=True)


BUILDS = Needs(
    space=True,
    server="start",
    flows=True,
    watched=True,
    prefect=True,
    keeps="the stages it finished are kept in the store (and a model's checkpoints), so the next "
    "`zhpipe "
    "run` reuses them",
)


_server_ready: Callable[[], None] = lambda: None


def server_ready() -> None:
    """Return once the Prefect server provided for a command that runs flows answers: a temporary
    one starts beside the command's own imports (flows/runtime/temporary.py), and the command waits
    for it here, just before its flow."""
    _server_ready()


def provide_server_ready(wait: Callable[[], None]) -> None:
    """The entry point says how `server_ready` waits (the runtime's)."""
    global _server_ready
    _server_ready = wait
