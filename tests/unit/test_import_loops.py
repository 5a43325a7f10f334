"""The two import loops issue 33 named are gone, imports inside functions and under
TYPE_CHECKING counted (grimp, as lint-imports reads them): fl/workflows/api.py uses secure.py,
never the other way; spec/study_runtime.py uses spec/pod_template.py, never the other way."""

from __future__ import annotations

import grimp
import pytest

PAIRS = [("atoll.fl.workflows.api", "atoll.fl.workflows.secure"),
         ("atoll.spec.study_runtime", "atoll.spec.pod_template")]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("atoll", cache_dir=None)


@pytest.mark.parametrize("user,used", PAIRS)
def test_one_way_only(graph, user, used):
    assert graph.direct_import_exists(importer=user, imported=used)  # the control
    assert graph.find_shortest_chain(importer=used, imported=user) is None
