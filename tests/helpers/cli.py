"""A zhpipe command run through `flows.cli.main` in the test process, read like a finished process
(returncode, stdout, stderr): for calls whose point is the answer, not the process, which would
spend seconds on imports."""

from types import SimpleNamespace


def in_process(capsys, *args) -> SimpleNamespace:
    """The command in this process; the project it activated (`--project DIR`, or found from the
    folder) is put back to what it was, as a process of its own would leave this one: a later test
    never reads another test's project."""
    from flows.cli import main
    from flows.plan import project

    before = project._CURRENT
    try:
        code = main([str(a) for a in args])
    finally:
        project._CURRENT = before
    printed = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=printed.out, stderr=printed.err)
