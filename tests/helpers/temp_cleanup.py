"""A passing run leaves nothing in the temp folder: the folders of passed tests go as each test ends
(pyproject's tmp_path_retention_policy = "failed"), and at the end of a run in which no test failed, the run's
whole base temp folder, with the stores, servers' databases and wheels that session fixtures made in it
(tmp_path_factory.mktemp). A run with a failure keeps everything, to look at. A --basetemp given by hand is
the user's: never removed. A plugin (tests/conftest.py's pytest_plugins)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _remove_temp_after_a_passing_run(tmp_path_factory: pytest.TempPathFactory,
                                     request: pytest.FixtureRequest) -> Iterator[None]:
    yield  # set up first, so torn down last: every other session fixture (servers, stores) has ended by then
    if request.session.testsfailed or request.config.getoption("basetemp"):
        return
    base = tmp_path_factory.getbasetemp()
    try:
        shutil.rmtree(base, ignore_errors=True)
    except KeyboardInterrupt:  # one line, not a traceback out of shutil
        pytest.exit(f"stopped while removing the tests' temp folder {base}: remove it with `rm -rf {base}`",
                    returncode=130)
