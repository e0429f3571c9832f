"""Session-wide test set-up: shared fixtures, and the OpenTelemetry SDK reader installed first."""

from __future__ import annotations

import pytest

from tests.support.metrics import metric_reader

pytest_plugins = ["tests.support.fake_host", "tests.support.cosmos", "tests.support.aio", "tests.support.records"]

metric_reader()


UNGROUPED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (make test), pytest-xdist marks each grouped test's node id with its group, and
    schedules by that mark. Where it could not (pytest 9.2 with pytest-xdist 3.8 did not), the whole-stack runs
    would go side by side and starve each other on 2 cores: each of them fails instead, saying why."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        return
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[UNGROUPED] = ("pytest-xdist could not group this test with the others of its xdist_group: the"
                                     " pinned pytest and pytest-xdist no longer agree on node ids")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)
