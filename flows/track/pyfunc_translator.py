"""The models-from-code entry of every logged zhpipe translator (task translation): MLflow stores this file as the
model's code and runs it on load; the weights are the model's `model.pt` (loaded with weights_only=True)."""
from mlflow.models import set_model

from flows.track.serving import TextTranslator

set_model(TextTranslator())
