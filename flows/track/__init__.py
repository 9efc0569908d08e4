"""The tracking room: MLflow runs, the champion rule and the model registry, serving and
predicting."""
