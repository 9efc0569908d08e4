"""The models-from-code entry of every logged zhpipe tagger (task ner): MLflow stores this file as the model's
code and runs it on load; the weights are the model's artifacts in formats that load without pickle."""
from mlflow.models import set_model

from flows.track.serving import EntityTagger

set_model(EntityTagger())
