"""The planning room: configs, the key plan, the stage store and its upkeep. Imports neither Prefect
nor MLflow."""
