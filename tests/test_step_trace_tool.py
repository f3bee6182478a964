"""``tools/step_trace.py`` on step traces kept in benchmarks/results: the run where Triton compiled
the sampler mid-run (``ee253fa``) must show its stalls, with the ``sample`` phase holding the
time; the run before that change (``b42732f``) none; nor a Llama-3.1-8B run (``d13769b``) whose first
decode step waited 49 ms in ``sync`` for the prefill before it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "2026-11-27"


def load_tool():
    spec = importlib.util.spec_from_file_location("step_trace", ROOT / "tools" / "step_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stalls_name_the_recompiling_run_and_not_the_clean_one(capsys):
    tool = load_tool()
    misaligned = tool.load(str(RESULTS / "peer-ee253fa-misaligned" / "steps-qwen3-0.6b-r1.jsonl.gz"))
    tool.stalls([s for s in misaligned if "kind" in s])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("decode steps over 5x their bucket's median: 2, 1.38 s"), lines
    assert all(line.split(": ", 1)[1].startswith("sample ") for line in lines[1:]), lines
    clean = tool.load(str(RESULTS / "peer-b42732f" / "steps-qwen3-0.6b-r1.jsonl.gz"))
    tool.stalls([s for s in clean if "kind" in s])
    assert capsys.readouterr().out.startswith("decode steps over 5x their bucket's median: 0, 0.00 s")


def test_a_decode_step_waiting_for_the_prefill_before_it_is_no_stall(capsys):
    tool = load_tool()
    steps = [
        s
        for s in tool.load(str(RESULTS / "peer-d13769b-llama" / "steps-llama-3.1-8b-r1.jsonl.gz"))
        if "kind" in s
    ]
    first = next(i for i, s in enumerate(steps) if s["kind"] == "decode")
    assert steps[first - 1]["kind"] == "prefill" and steps[first]["ms"]["sync"] > 40, steps[first]
    tool.stalls(steps)
    assert capsys.readouterr().out.startswith("decode steps over 5x their bucket's median: 0, 0.00 s")


def test_a_plain_trace_named_gz_reads_as_the_gzipped_one(tmp_path):
    """The engine appends plain JSON lines whatever the file is called: ``--step-trace steps.jsonl.gz``
    gives a plain file, which the tool must read (it took the name's word and failed) the same as
    the gzipped copy benchmarks/results keeps."""
    import gzip

    tool = load_tool()
    kept = RESULTS / "peer-b42732f" / "steps-qwen3-0.6b-r1.jsonl.gz"
    plain = tmp_path / "steps.jsonl.gz"
    plain.write_bytes(gzip.decompress(kept.read_bytes()))
    assert tool.load(str(plain)) == tool.load(str(kept))
    assert len(tool.load(str(plain))) > 100


def test_long_prefills_phases_show_the_one_copy_planning_wait(capsys):
    """The H200 traces of 2026-12-02 (one round each, the same call): with the one-copy step inputs
    (``ab4246f``) an offline run's 8,192-token prefill steps spend 8-11 ms planning (waiting for the
    device there) where the core before (``78efcdc``) spent 3.6-4.8 and waited in ``sync``; the
    tool's long-prefill row shows it, apart from the short prefills of the batch-1 measurement."""
    tool = load_tool()
    kept = ROOT / "benchmarks" / "results" / "2026-12-02" / "core-ab-ab4246f-vs-78efcdc"
    means = {}
    for which in ("before", "after"):
        steps = [s for s in tool.load(str(kept / f"steps-{which}.jsonl.gz")) if "kind" in s]
        means[which] = tool.phases_by_kind(steps)
    out = capsys.readouterr().out
    assert "prefill >=4096" in out and "prefill <4096" in out, out
    before, after = means["before"]["prefill >=4096"], means["after"]["prefill >=4096"]
    assert before["schedule"] < 5 < 7 < after["schedule"], (before, after)
    assert before["sync"] > 8 > 5 > after["sync"], (before, after)


def test_schedule_parts_print_inside_schedule_in_planning_order():
    """A step's ``schedule.<part>`` phases print in brackets after ``schedule``, in the order
    planning runs them (an unknown part last), the other phases by host time, most first."""
    tool = load_tool()
    phases = {"sync": 4.0, "schedule": 3.0, "schedule.copy": 0.5, "schedule.plan": 0.25, "schedule.new": 0.1}
    phases |= {"forward": 5.0, "schedule.pack": 1.0}
    assert tool.phase_text(phases) == (
        "forward 5.00  sync 4.00  schedule 3.00 (plan 0.25, pack 1.00, copy 0.50, new 0.10)"
    )
    assert tool.phase_text({"sample": 0.26, "schedule": 1.0}, digits=1) == "schedule 1.0  sample 0.3"


def _run_tool(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "step_trace.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_file_it_cannot_read_is_one_line_naming_it_not_a_traceback(tmp_path):
    """A missing, empty, non-JSON, truncated-gzip or wrong-kind file was a traceback (or an
    IndexError on an empty one); each is one line naming the file and what is wrong, status 2."""
    import gzip

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "text.jsonl").write_text("hello\n")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "cut.jsonl").write_bytes(gzip.compress(b'{"t": 1, "dt": 0.1}\n' * 50)[:20])
    expected = {
        "missing.jsonl": "No such file or directory",
        "empty.jsonl": "holds no records",
        "text.jsonl": "line 1: not a JSON record: 'hello'",
        "list.jsonl": "line 1: a record without t, dt",
        "cut.jsonl": "cannot read",
    }
    for name, words in expected.items():
        done = _run_tool(str(tmp_path / name))
        assert done.returncode == 2, (name, done.stderr)
        assert "Traceback" not in done.stderr and words in done.stderr, (name, done.stderr)
        assert str(tmp_path / name) in done.stderr


def test_a_step_trace_passed_as_the_request_trace_is_named_as_the_wrong_kind(tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"t": 1.0, "dt": 0.1, "kind": "decode", "reqs": 2, "tokens": 2, "running": 2}\n')
    assert _run_tool(str(steps)).returncode == 0
    done = _run_tool(str(steps), "--requests", str(steps))
    assert done.returncode == 2 and "a record without sent, first, chunks:" in done.stderr
    for bucket, words in (
        ("0", "give a positive number"),
        ("nan", "give a positive number"),
        ("1e-9", "rows"),
    ):
        done = _run_tool(str(steps), "--bucket", bucket)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_trace_from_a_pipe_reads_whole_gzipped_or_not(tmp_path):
    """``step_trace.py <(zcat steps.jsonl.gz)``: the file was opened twice (once to sniff for
    gzip), so a pipe lost its first two bytes and the first record failed to parse."""
    import gzip
    import os
    import threading

    record = b'{"t": 1.0, "dt": 0.1, "kind": "decode", "reqs": 2, "tokens": 2, "running": 2}\n'
    for payload in (record * 3, gzip.compress(record * 3)):
        fifo = tmp_path / f"pipe{len(payload)}"
        os.mkfifo(fifo)
        # a daemon: the old reader, gone after two bytes, would leave it blocked for good
        threading.Thread(target=lambda f=fifo, p=payload: f.write_bytes(p), daemon=True).start()
        done = _run_tool(str(fifo))  # its own timeout: the old reader waited on a second open
        assert done.returncode == 0, done.stderr
        assert "wall 0.10 s, 3 steps" in done.stdout


def test_a_record_with_fields_no_summary_can_use_is_one_line_naming_it(tmp_path):
    """A step with ``t`` a string or NaN, a busy step without ``reqs``, a trace going back in time
    (two runs' traces joined) or a step of negative duration was a TypeError, ValueError, KeyError
    or IndexError traceback mid-summary; each is one line naming the file and the record."""
    step = '{"t": %s, "dt": %s, "kind": "decode", "reqs": 1, "tokens": 1, "running": 1}\n'
    traces = {
        "text.jsonl": ('{"t": "x", "dt": 1}\n', "line 1: t is 'x', not a finite number"),
        "nan.jsonl": ('{"t": NaN, "dt": 1}\n', "line 1: t is 'nan', not a finite number"),
        "bool.jsonl": (step.replace('"reqs": 1', '"reqs": true') % (1, 0.1), "line 1: reqs is 'True', not a finite number"),
        "no-reqs.jsonl": ('{"t": 1, "dt": 0.1, "kind": "decode"}\n', "line 1: a record without reqs, tokens, running"),
        "back.jsonl": (step % (100, 0.1) + step % (5, 0.1), "record 2 starts at 5, before record 1's 100: a trace of more than one run?"),
        "negative.jsonl": (step % (1, -5), "record 1 lasts -5 s, less than nothing"),
    }  # fmt: skip
    for name, (text, words) in traces.items():
        (tmp_path / name).write_text(text)
        done = _run_tool(str(tmp_path / name))
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, (name, done.stderr)
        assert done.stderr.startswith(f"step_trace: {tmp_path / name}") and words in done.stderr, (
            name,
            done.stderr,
        )
