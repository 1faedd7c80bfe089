"""Project-wide test settings: a skipped test is a failed run when ci/test runs the suite, and
the modules of the hostile tier run last."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.fixtures", "tests.e2e.harness"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with hostile-tier tests run last, each whole and in order: they compare
    latencies quiet and flooded (ci/test runs the tier in a process of its own once the others
    have ended, and this order keeps a run of several tiers the same). Before them, the modules on
    containerd 2 (tests/node/conftest.py on_containerd2) one after another: the node is laid
    out so once for them all, and back once."""
    hostile = {item.path for item in items if item.get_closest_marker("hostile") is not None}
    containerd2 = {
        item.path for item in items if "on_containerd2" in getattr(item, "fixturenames", ())
    }
    # stable: the order within is kept
    items.sort(key=lambda item: (item.path in hostile, item.path in containerd2))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("ISTIO_CNI_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    if reporter is not None and skipped and session.exitstatus == 0:
        reporter.write_line(f"FAILED: {skipped} test(s) skipped; a missing part is a failure here")
        session.exitstatus = 1
