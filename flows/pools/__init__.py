"""Where work runs, below the rooms that use it (orchestrate runs stages on it, track scores and
registers on it): chunk pools (this machine's processes, or a Dask cluster: chunks.py) and locks
that span machines (slots.py)."""
