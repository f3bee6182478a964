"""The order the tree's ``conftest.py`` gives test files under pytest-xdist (``make test``): the
slowest files first (``SLOW_FILES``), then the rest by their number of tests, most first."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minisgl_tree_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


COLLECTED = [
    "tests/a.py::one",
    "tests/slow.py::one",
    "tests/b.py::one",
    "tests/b.py::two[x]",
    "tests/slower.py::one",
    "tests/slow.py::two",
    "tests/c.py::one",
]


def _ordered(monkeypatch, worker: str | None) -> list[str]:
    conftest = _root_conftest()
    monkeypatch.setattr(conftest, "SLOW_FILES", {"tests/slow.py": 30.0, "tests/slower.py": 90.0})
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    items = [_Item(nodeid) for nodeid in COLLECTED]
    conftest.pytest_collection_modifyitems(None, items)
    return [item.nodeid for item in items]


def test_workers_take_the_slowest_files_first_then_the_files_of_most_tests(monkeypatch):
    """By number of tests alone (pytest-xdist's order), files of one or two slow tests (a server
    started each) came last, and one worker could hold three of them while the other had none."""
    assert _ordered(monkeypatch, "gw0") == [
        "tests/slower.py::one",
        "tests/slow.py::one",
        "tests/slow.py::two",
        "tests/b.py::one",  # two tests, a file's own order kept
        "tests/b.py::two[x]",
        "tests/a.py::one",  # one test each: collected first, first
        "tests/c.py::one",
    ]


def test_one_process_keeps_the_collections_order(monkeypatch):
    assert _ordered(monkeypatch, None) == COLLECTED


def test_every_slow_file_is_a_test_file_of_the_tree():
    """A slow file renamed or removed would lose its place silently."""
    slow = _root_conftest().SLOW_FILES
    assert slow, "SLOW_FILES is empty"
    missing = [path for path in slow if not (ROOT / path).is_file() or "/test_" not in f"/{path}"]
    assert missing == []
    assert list(slow.values()) == sorted(slow.values(), reverse=True)  # kept slowest first, to read
