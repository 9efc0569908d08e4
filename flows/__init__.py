"""zhpipe orchestration: configuration, the stage store, Prefect flows and deployments, MLflow
tracking and the registry, the command line and the Python API. Imports tasks/, never the other way
round; importing it sets nothing in the environment (the project folder is activated by the CLI and
the API)."""
