"""zhpipe flows, configuration, stage store, tracking and the command line."""
import os
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent

# Set before Prefect is imported anywhere: a project-local Prefect home (never the user's ~/.prefect by
# surprise) and an ephemeral-server start-up timeout well above the 20 s default, which a first start on a
# 2-core machine (21-24 s) overruns at random. Values already in the environment win.
os.environ.setdefault("PREFECT_HOME", str(_ROOT / ".prefect"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `zhpipe deploy` passes the file's schedules; an empty list must clear a deployment's old ones
os.environ.setdefault("PREFECT_DEPLOYMENTS_CLEAR_SCHEDULES_ON_EMPTY", "true")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "zhpipe")  # our log lines reach the Prefect UI and worker logs
# INFO from zhpipe's own logger reaches Prefect's handlers (worker logs, the UI) even where the root
# logger is left at WARNING, as in the flow-run processes a worker starts
import logging as _logging  # noqa: E402

_logging.getLogger("zhpipe").setLevel(_logging.INFO)
