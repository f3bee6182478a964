"""`minisgl bench offline` says how far its timed run is: on a CPU, README's command printed
nothing for minutes after start-up, and a user could not tell it from a hang. The lines go to
stderr; the JSON result stays stdout's only line."""

from __future__ import annotations

import re
import time

import pytest

from minisgl_core import LLM
from minisgl_core.bench.offline import ProgressLines, run_offline
from minisgl_core.bench.workloads import BenchRequest
from minisgl_core.testing import make_model_dir


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")
    with LLM(model, attn="torch", device="cpu", num_kv_tokens=4096) as llm:
        yield llm


def test_the_timed_run_prints_progress_lines_on_stderr(llm, capsys):
    requests = [BenchRequest(list(range(5, 5 + n)), 48) for n in (8, 16, 24, 32, 40, 12)]
    result = run_offline(llm, requests, progress_every=0.001)
    assert result["output_tokens"] == 6 * 48
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[:2] == [
        "minisgl bench offline: warming up (4 requests of 8 tokens)",
        "minisgl bench offline: timing 6 requests (288 output tokens); a line every 0.001 s",
    ]
    progress = [
        line for line in lines[2:] if re.fullmatch(r"minisgl bench offline: \d/6 requests done, \d+ s", line)
    ]
    assert progress and len(progress) == len(lines) - 2, err


def test_no_progress_lines_unless_asked(llm, capsys):
    run_offline(llm, [BenchRequest([5, 6, 7], 4)])
    assert capsys.readouterr() == ("", "")


def test_progress_lines_count_what_finished_and_stop_when_closed(capsys):
    bar = ProgressLines(total=3, every=0.01, desc="generate", unit="req")
    bar.update(1)
    time.sleep(0.1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(line.startswith("minisgl bench offline: 1/3 requests done, ") for line in lines)
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # (its thread ended)


def test_a_grammar_complete_before_max_tokens_ends_its_requests_and_the_figures_count_what_ran(llm, capsys):
    """``--grammar-schema`` with a schema shorter than the outputs (``{"type": "boolean"}``): the
    run's result was lost to "RuntimeError: generated 4 tokens, workload asks for 724" after it."""
    import json

    from minisgl_core.api import GrammarSpec

    requests = [BenchRequest(list(range(5, 5 + n)), 32) for n in (8, 16, 24)]
    grammar = GrammarSpec("json_schema", json.dumps({"type": "boolean"}))
    result = run_offline(llm, requests, grammar=grammar, progress_every=60)
    assert result["grammar_short_requests"] == 3 and result["workload_output_tokens"] == 3 * 32
    assert 3 <= result["output_tokens"] < 3 * 32  # "true" or "false": a few tokens each
    err = capsys.readouterr().err
    assert "3 of 3 requests ended when their grammar was complete, before max_tokens" in err, err
