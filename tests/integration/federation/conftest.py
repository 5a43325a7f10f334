from __future__ import annotations

import pytest

from tests.integration.federation.harness import Federation

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """A server and two sites, as separate processes, shared by a module's tests."""
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), ["site-1", "site-2"], USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()
