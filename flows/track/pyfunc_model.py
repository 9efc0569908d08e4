"""The models-from-code entry of every logged zhpipe model, whatever its task kind: MLflow stores
this file as the model's code and runs it on load; the model's zhpipe.json names the kind's serving
module, and the weights are the model's artifacts in formats that load without pickle. The flows and
tasks packages logged with the model are one archive, `code/zhpipe-code.zip` (older models: the
folders `code/flows` and `code/tasks`, which MLflow puts on sys.path itself), put first on sys.path
here."""

import sys
from pathlib import Path

_ARCHIVE = Path(__file__).resolve().with_name("code") / "zhpipe-code.zip"
if _ARCHIVE.is_file() and str(_ARCHIVE) not in sys.path:
    sys.path.insert(0, str(_ARCHIVE))

from mlflow.models import set_model  # noqa: E402

from flows.track.serving import ServedModel  # noqa: E402

set_model(ServedModel())
