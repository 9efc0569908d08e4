"""The order in which pytest-xdist hands out the test files (`--dist loadfile`): the team modules as one unit, first.

The team modules share one set of team servers per test process (tests/flows/team/conftest.py). Handed out as
separate files, they land on both workers, each of which starts its own team (PostgreSQL, MLflow, Prefect, S3:
20-30 s and about 40 s of CPU); as one unit, one worker starts one team. They go first because together they are the
longest unit by far (about ten minutes of one worker): started last, the suite would wait on them alone. The other
files follow in xdist's own order (most tests first), handed to whichever worker is free."""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

TEAM = "tests/flows/team/"


def scope(nodeid: str) -> str:
    """The unit a test goes out in: its file, or the team's folder."""
    return TEAM if nodeid.startswith(TEAM) else nodeid.split("::", 1)[0]


def ordered(nodeids: list[str]) -> list[str]:
    """The team's tests first, then each file's tests together, files with the most tests first."""
    count: dict[str, int] = {}
    for nodeid in nodeids:
        count[scope(nodeid)] = count.get(scope(nodeid), 0) + 1
    first = {s: i for i, s in enumerate(count)}
    return sorted(nodeids, key=lambda n: (scope(n) != TEAM, -count[scope(n)], first[scope(n)]))


class TeamFirst(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return scope(nodeid)

    def schedule(self) -> None:
        if self.collection is None:  # the first call: the work queue is built from the (same) collection of each worker
            self.config.option.loadscopereorder = False
            for node, nodeids in self.registered_collections.items():
                self.registered_collections[node] = ordered(list(nodeids))
        super().schedule()
