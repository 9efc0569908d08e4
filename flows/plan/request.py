"""What a run is asked to build: one pipeline of a config file, with its `--set` lines and its
`--source`, made once where the run starts (the command line, the Python API, a deployment's
parameters) and carried whole down to the remote training stage. It holds plain values, because
Prefect records a flow's parameters and a deployment passes them as JSON; `config()` is the one
parse of them into the typed `PipelineConfig` every stage reads, made once per run where the run
starts and handed down typed (`typed`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import ZhpipeError


@dataclass(frozen=True)
class RunRequest:
    """A pipeline by name, its overrides (URLs in them redacted: a concealed URL is revealed in this
    process only), its other corpus (`--source` as a mapping) and its config file (None: the
    project's pipelines.yaml)."""

    pipeline: str
    overrides: tuple[str, ...] = ()
    source: dict[str, Any] | None = None
    config_file: str | None = None

    @classmethod
    def of(
        cls, pipeline: Any, overrides: Any = None, source: Any = None, config_file: Any = None
    ) -> RunRequest:
        """A request from parameters as a flow receives them; a value of the wrong type is one clear
        error (a deployment run may pass anything the Prefect API accepts)."""
        if not isinstance(pipeline, str):
            raise ZhpipeError(f"pipeline: expected a pipeline name, got {type(pipeline).__name__}")
        if overrides is not None and not (
            isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides)
        ):
            raise ZhpipeError(
                f"overrides: expected a list of STAGE.PARAM=VALUE lines, got {overrides!r:.80}"
            )
        if source is not None and not isinstance(source, dict):
            raise ZhpipeError(
                f"source: expected a mapping such as {{'path': 'corpus.csv'}}, got {source!r:.80}"
            )
        if config_file is not None and not isinstance(config_file, (str, Path)):
            raise ZhpipeError(f"config_file: expected a path, got {type(config_file).__name__}")
        from flows.plan.config import conceal_urls

        given = conceal_urls({k: v for k, v in source.items() if v is not None}) if source else None
        return cls(
            pipeline,
            tuple(_concealed(o) for o in overrides or ()),
            given or None,
            str(config_file) if config_file is not None else None,
        )

    def config(self):
        """The pipeline's validated config, parsed from the request's plain values (the one place a
        run parses them)."""
        from flows.plan.config import load_pipeline
        from flows.plan.project import current

        file = Path(self.config_file) if self.config_file else current().config_file
        return load_pipeline(self.pipeline, file, list(self.overrides), self.source)

    def typed(self, parsed: Any = None):
        """The config a flow runs: `parsed`, the caller's own parse of this request in this process,
        else `config()` (a deployment's run, whose parameters arrive as JSON). A `parsed` that is
        not this request's typed config (a deployment run given one in its parameters) is one clear
        error."""
        if parsed is None:
            return self.config()
        from flows.plan.config import PipelineConfig

        if not isinstance(parsed, PipelineConfig) or parsed.name != self.pipeline:
            raise ZhpipeError(
                f"parsed: expected the typed config of pipeline '{self.pipeline}' from a caller in "
                "this "
                f"process, got {type(parsed).__name__}; leave it out and the run parses its request"
            )
        return parsed

    def parameters(self) -> dict[str, Any]:
        """The request as a flow's parameters (what Prefect records and a deployment run
        receives)."""
        return {
            "pipeline": self.pipeline,
            "overrides": list(self.overrides),
            "source": self.source,
            "config_file": self.config_file,
        }

    def changed(self) -> str:
        """The overrides as a run's name shows them: `train.epochs=2 split.seed=3`."""
        return " ".join(o.replace(" ", "") for o in self.overrides)

    def __hash__(self) -> int:
        return hash(
            (
                self.pipeline,
                self.overrides,
                json.dumps(self.source, sort_keys=True, default=str),
                self.config_file,
            )
        )


def _concealed(assignment: str) -> str:
    """An override as a request holds it: each URL with credentials redacted, the real one kept in
    this process (as the config keeps it) so that the run it starts here can still connect."""
    from tasks.util.urls import redact_text

    shown = redact_text(assignment)
    if shown != assignment:
        from flows.plan.config import conceal_urls
        from flows.plan.values import apply_set

        apply_set(scratch := {}, assignment)
        conceal_urls(scratch)
    return shown
