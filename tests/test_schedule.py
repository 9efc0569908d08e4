"""The order xdist hands out the test files in (tests/helpers/schedule.py)."""

from types import SimpleNamespace

from tests.helpers.schedule import TEAM, reorder, scope


def test_the_team_modules_go_out_first_as_one_unit_and_the_other_files_by_their_number_of_tests():
    nodeids = [
        "tests/a.py::t1",
        "tests/b.py::t1",
        "tests/b.py::t2",
        f"{TEAM}test_team.py::t1",
        "tests/c.py::t1",
        f"{TEAM}test_doctor.py::t1",
        "tests/b.py::t3",
        "tests/a.py::t2",
    ]
    items = [SimpleNamespace(nodeid=n) for n in nodeids]
    reorder(items)
    got = [item.nodeid for item in items]
    assert got[:2] == [f"{TEAM}test_team.py::t1", f"{TEAM}test_doctor.py::t1"]
    assert got[2:] == [
        "tests/b.py::t1",
        "tests/b.py::t2",
        "tests/b.py::t3",
        "tests/a.py::t1",
        "tests/a.py::t2",
        "tests/c.py::t1",
    ]  # a file's tests keep their order
    assert {scope(n) for n in got[:2]} == {TEAM}
