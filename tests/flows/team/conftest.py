"""The team's servers (tests/helpers/team.py), started once per test module: each module breaks them its own way (a
server killed, a password changed, the bucket cut), so no module sees another's faults."""
from __future__ import annotations

import pytest

from tests.helpers.team import machine, start_team


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    services = start_team(tmp_path_factory.mktemp("team"))
    yield services
    services.close()


@pytest.fixture(scope="module")
def alice(team, tmp_path_factory):
    """alice's machine: (environment, project folder)."""
    return machine(team, tmp_path_factory.mktemp("alice"), "alice")
