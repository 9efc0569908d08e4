"""A zhpipe command run through `flows.cli.main` in the test process, read like a finished process (returncode,
stdout, stderr): for calls whose point is the answer, not the process, which would spend seconds on imports."""
from types import SimpleNamespace


def in_process(capsys, *args) -> SimpleNamespace:
    from flows.cli import main

    code = main([str(a) for a in args])
    printed = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=printed.out, stderr=printed.err)
