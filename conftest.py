"""Settings for every test of the tree (the core's and the plugins'), read before any test module.

Under pytest-xdist (``make test`` runs two workers, one per core of a CI machine) each worker and
every process it starts (servers, CLI runs) uses one CPU thread: torch's default of one thread per
core would put four OpenMP threads on two cores, whose spin-waits stall each other."""

from __future__ import annotations

import os

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# --- the order test files are handed to pytest-xdist's workers, and how long each file took ---

#: Seconds the slowest test files take (their setups, calls and teardowns summed, as
#: --file-durations prints them after a run; these from single runs, -n 0, on a loaded 2-core
#: machine, session fixtures such as the shared server included: the order is what counts).
#: `make test` hands whole files to two workers (--dist loadfile) in the order the workers
#: collected them (--no-loadscope-reorder): these first, slowest first, then the rest by their
#: number of tests, most first (pytest-xdist's own order). By number of tests alone, files of a few
#: slow tests (test_wheels, test_process_hooks, the router's and the MoE server's) were dealt out
#: among the last, and a worker may hold up to three files queued (it takes one more whenever two
#: tests of its own are left): a slow one dealt last is the run's end, the other worker idle.
SLOW_FILES: dict[str, float] = {
    "tests/server/test_shutdown.py": 362,
    "tests/server/test_tensor_parallel_server.py": 308,
    "tests/server/test_pause_generation.py": 190,
    "tests/test_wheels.py": 160,
    "tests/test_config_errors.py": 156,
    "tests/server/test_shell.py": 141,
    "tests/server/test_overload.py": 138,
    "tests/server/test_real_model_tools.py": 117,
    "tests/server/test_real_model.py": 116,
    "tests/server/test_responses_api.py": 116,
    "tests/test_plugins.py": 114,
    "tests/test_quantization_accuracy.py": 108,
    "tests/server/test_tool_parser_formats.py": 108,
    "plugins/attention/triton/tests/test_engine.py": 97,
    "tests/test_real_weights.py": 90,
    "tests/server/test_tools_api.py": 89,
    "tests/test_cli_generate.py": 86,
    "tests/server/test_generation_defaults.py": 83,
    "tests/server/test_priority.py": 76,
    "tests/server/test_bench_cli.py": 73,
    "tests/server/test_cached_tokens.py": 72,
    "tests/server/test_request_chat_template.py": 67,
    "tests/server/test_chat_echo.py": 65,
    "tests/server/test_update_weights.py": 60,
    "tests/test_process_hooks.py": 46,
    "tests/server/test_grammar_compile.py": 40,
    "tests/server/test_openai_api.py": 40,
    "tests/server/test_lifecycle.py": 37,
    "tests/server/test_deepseek_r1_reasoning.py": 36,
    "tests/server/test_moe_server.py": 35,
    "tests/server/test_router.py": 32,
    "tests/server/test_reasoning_grammar_api.py": 31,
    "tests/test_cli_runner.py": 31,
    "tests/server/test_load.py": 30,
    "tests/server/test_streaming.py": 29,
    "tests/server/test_special_tokens.py": 26,
    "tests/test_legacy_plugin.py": 20,
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--file-durations",
        type=int,
        default=0,
        metavar="N",
        help="after the run, the N slowest test files (their setups, calls and teardowns summed), "
        "and each pytest-xdist worker's busy seconds",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist only (each worker collects, and all must agree): whole files, slowest
    first (see SLOW_FILES); a single process keeps the collection's order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(by_file, key=lambda path: (-SLOW_FILES.get(path, 0.0), -len(by_file[path])))
    items[:] = [item for path in order for item in by_file[path]]


_file_seconds: dict[str, float] = {}
_worker_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None:
        _worker_seconds[worker.id] = _worker_seconds.get(worker.id, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    count = config.getoption("file_durations", 0)
    if not count or "PYTEST_XDIST_WORKER" in os.environ:
        return
    terminalreporter.write_sep("=", f"slowest {count} test files")
    slowest = sorted(_file_seconds.items(), key=lambda pair: -pair[1])[:count]
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    for worker, seconds in sorted(_worker_seconds.items()):
        terminalreporter.write_line(f"worker {worker}: {seconds:.1f}s of tests")
