"""The order in which pytest-xdist hands out the test files (`--dist loadfile`): the team modules as
one unit, first.

The team modules share one set of team servers per test process (tests/flows/team/conftest.py).
Handed out as separate files, they land on both workers, each of which starts its own team
(PostgreSQL, MLflow, Prefect, S3: 20-30 s and about 40 s of CPU); as one unit, one worker starts one
team. They go first because together they are the longest unit by far (about 470 seconds of one
worker): started last, the suite would wait on them alone. The other files follow in xdist's own
order (most tests first), handed to whichever worker is free."""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

TEAM = "tests/flows/team/"


def scope(nodeid: str) -> str:
    """The unit a test goes out in: its file, or the team's folder."""
    return TEAM if nodeid.startswith(TEAM) else nodeid.split("::", 1)[0]


def order(nodeids: list[str]) -> dict[str, tuple]:
    """Each test's place: the team's tests first, then each file's tests together, files with the
    most tests first (in a file, the tests keep their order)."""
    count: dict[str, int] = {}
    for nodeid in nodeids:
        count[scope(nodeid)] = count.get(scope(nodeid), 0) + 1
    first = {s: i for i, s in enumerate(count)}
    return {
        n: (scope(n) != TEAM, -count[scope(n)], first[scope(n)], i) for i, n in enumerate(nodeids)
    }


def reorder(items: list) -> None:
    """Put a worker's collected tests in that order (every worker collects the same tests, and the
    scheduler names tests by their index in that collection, so the order is set where they are
    collected)."""
    place = order([item.nodeid for item in items])
    items.sort(key=lambda item: place[item.nodeid])


class TeamFirst(LoadFileScheduling):
    """Units of work in the order the workers collected their tests (`reorder`), the team's folder
    one unit."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return scope(nodeid)
