"""The models-from-code entry of every logged zhpipe model, whatever its task kind: MLflow stores this file as the
model's code and runs it on load; the model's zhpipe.json names the kind's serving module, and the weights are the
model's artifacts in formats that load without pickle."""
from mlflow.models import set_model

from flows.track.serving import ServedModel

set_model(ServedModel())
