"""zhpipe's stages as plain Python: one package per task kind (classification, ner, translation)
with a module per stage (`Params` and `build(ctx)`), what the kinds share at this level (segment,
normalising, reports, vectors, I/O), the model registry (models/) and the sources (source/). Imports
neither flows/ nor Prefect nor MLflow."""
