"""The orchestration room: the Prefect flow, stage execution, deployments, workers, Dask, the
background server and the warm process."""
