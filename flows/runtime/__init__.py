"""The runtime that cuts command start-up, a room of its own: the project's background Prefect
server (server.py), the warm process that has a run's imports done (warm.py) and the hand-over of a
command to it (handover.py), the records that say which processes are ours (procs.py), what a
command's declared needs get (provide.py) and the `zhpipe server` command (commands.py). Only the
CLI's entry point (flows/cli/__init__.py) imports this room; the arrows run one way
(tests/test_layers.py)."""
