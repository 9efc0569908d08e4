"""The team's servers (tests/helpers/team.py), started once per test process (each xdist worker that
runs a team module) and shared by its team modules, one after another: a fault test puts back what
it broke (the tracking server started again, the database back, the bucket reachable), and each
module's machines are its own (HOME, project folder). A check never assumes the team's experiment,
registry or bucket holds only its own module's runs."""

from __future__ import annotations

import pytest

from tests.helpers.team import machine, start_team


@pytest.fixture(scope="session")
def team(tmp_path_factory):
    services = start_team(tmp_path_factory.mktemp("team"))
    yield services
    services.close()


@pytest.fixture(scope="module")
def alice(team, tmp_path_factory):
    """alice's machine: (environment, project folder)."""
    return machine(team, tmp_path_factory.mktemp("alice"), "alice")
