"""A task's header from the server is rebuilt from its checked fields before a worker sees it."""

from __future__ import annotations

import pytest

from atoll.site.worker_backend import check_task_head
from atoll.spec.names import IdentifierError
from atoll.wire.frames import FrameError
from atoll.wire.handoff import KEY


def test_a_good_header_keeps_only_its_fields():
    head = {"task_id": "t1", "topic": "train", "headers": {"round": 3}, KEY: "../../etc/passwd"}
    assert check_task_head(head) == {"task_id": "t1", "topic": "train",
                                     "headers": {"round": 3}}
    assert check_task_head({"end": True, KEY: "x"}) == {"end": True}
    assert check_task_head({"none": True}) == {"none": True}


@pytest.mark.parametrize("head", [
    {"task_id": "../x", "topic": "train"},
    {"task_id": "t1\n", "topic": "train"},
    {"task_id": "t1", "topic": "$(id)"},
    {"task_id": "t1", "topic": None},
    {"task_id": "t1", "topic": "train", "headers": {"round": -1}},
    {"task_id": "t1", "topic": "train", "headers": {"round": "1"}},
])
def test_crafted_ids_names_and_rounds_are_refused(head):
    with pytest.raises(IdentifierError):
        check_task_head(head)


@pytest.mark.parametrize("head", [{"end": "yes"}, {}, {"task_id": "t1", "topic": "train",
                                                        "headers": ["x"]}])
def test_a_header_of_no_known_shape_is_refused(head):
    with pytest.raises(FrameError):
        check_task_head(head)
