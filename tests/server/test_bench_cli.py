"""`minisgl bench serve` as the README runs it: no --model (the server says which), prompts the
served tokenizer accepts (ids folded into its vocabulary), clear one-line errors otherwise."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from minisgl_core.bench.serve import (
    BenchError,
    ServedModel,
    check_context,
    chunk_tokens,
    fit_vocab,
    prompt_texts,
    request_body,
    short_requests,
    whole_words,
)
from minisgl_core.bench.workloads import BenchRequest, shared_prefix
from minisgl_core.testing.cli_runner import run_cli

from .conftest import API_KEY
from .test_shell import fake_server

SMALL = ["--workload", "shared-prefix", "--groups", "2", "--prompts-per-group", "2", "--prefix-len", "48",
         "--question-len", "8", "--output-len", "4"]  # fmt: skip


def bench(*args: str, api_key_env: str | None = None) -> subprocess.CompletedProcess:
    """``api_key_env``: MINISGL_API_KEY's value in bench's environment (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MINISGL_API_KEY"}
    if api_key_env is not None:
        env["MINISGL_API_KEY"] = api_key_env
    return run_cli(["bench", "serve", *args], timeout=180, env=env)


def test_bench_serve_finds_the_model_and_fits_the_vocabulary(server, model_name: str) -> None:
    # Two at a time: the second prompt of each group is sent once a first one has finished, so its
    # prefix is in the cache (sent all at once, each may be admitted before any prefix is stored).
    proc = bench("--url", server.url, "--api-key", API_KEY, *SMALL, "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["model"] == model_name
    assert result["requests"] == 4 and result["output_tokens"] == 4 * 4
    assert 0 < result["prefix_hit_rate"] <= 1
    assert result["prompt_tokens_served"] == result["prompt_tokens"] == 4 * (48 + 8)
    # latency percentiles: time to first token, and between tokens (what mixed steps change). A
    # busy server merges a stream's tokens into fewer chunks (CI once got one chunk per request):
    # the gaps between chunks are timed where there are any, else there is no figure (null).
    assert result["requests"] <= result["output_chunks"] <= result["output_tokens"]
    names = ("ttft_ms", "itl_ms", "tpot_ms") if result["output_chunks"] > result["requests"] else ("ttft_ms",)
    for name in names:
        assert 0 < result[f"{name}_p50"] <= result[f"{name}_p99"] < 180_000, name
    if result["output_chunks"] == result["requests"]:
        assert result["itl_ms_p50"] is None and result["itl_ms_p99"] is None


def test_bench_serve_at_a_request_rate_times_the_requests_not_a_gap_after_the_last(server) -> None:
    """The sender slept one more exponential gap after the last request, and it was timed: with
    ``--request-rate`` the seconds were the gaps' sum, the throughput understated (a probe's find).
    One request at 0.1 a second draws a gap of 18.6 s (the sender seeds its gaps with 0) that must not be waited for."""
    import random

    assert random.Random(0).expovariate(0.1) > 10
    one = ["--workload", "shared-prefix", "--groups", "1", "--prompts-per-group", "1", "--prefix-len", "8",
           "--question-len", "2", "--output-len", "2"]  # fmt: skip
    proc = bench("--url", server.url, "--api-key", API_KEY, *one, "--request-rate", "0.1", "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["requests"] == 1 and result["seconds"] < 10, result


def test_bench_serve_errors_are_one_line(server) -> None:
    unreachable = bench("--url", "http://127.0.0.1:9", *SMALL)
    assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr
    assert unreachable.stderr.startswith("minisgl bench serve: cannot reach the server at http://127.0.0.1:9")
    no_key = bench("--url", server.url, *SMALL)
    assert no_key.returncode != 0 and "HTTP 401" in no_key.stderr and "Traceback" not in no_key.stderr
    too_long = bench("--url", server.url, "--api-key", API_KEY, *SMALL[:-2], "--output-len", "4000")
    assert too_long.returncode != 0 and "Traceback" not in too_long.stderr
    assert "needs 4056 tokens (prompt + output)" in too_long.stderr


def test_bench_serve_names_the_servers_refusal_of_a_request_in_one_line(server, model_name: str) -> None:
    """A request the server answered with an error (a --model it does not serve: 404) was a
    30-line traceback ending in the raw bytes of the body; now the status and OpenAI's message."""
    proc = bench("--url", server.url, "--api-key", API_KEY, *SMALL, "--model", "nosuchmodel")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == (
        "minisgl bench serve: the server answered HTTP 404: the model 'nosuchmodel' does not exist; "
        f"this server serves {model_name!r}\n"
    )


def test_bench_serve_takes_an_openai_base_url_and_hints_the_key_only_when_refused(server) -> None:
    """``--url .../v1`` (an OpenAI client's base URL) asked for /v1/v1/models, and its 404 was
    hinted "(--api-key?)"."""
    for url in (f"{server.url}/v1", f"{server.url}/v1/"):
        proc = bench("--url", url, "--api-key", API_KEY, *SMALL)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.strip().splitlines()[-1])["output_tokens"] == 4 * 4
    not_found = bench("--url", f"{server.url}/elsewhere", "--api-key", API_KEY, *SMALL)
    assert not_found.returncode == 1 and "Traceback" not in not_found.stderr, not_found.stderr
    assert not_found.stderr.startswith(
        f"minisgl bench serve: {server.url}/elsewhere/v1/models answered HTTP 404"
    )
    assert "--api-key" not in not_found.stderr
    no_key = bench("--url", server.url, *SMALL)
    assert no_key.stderr.startswith(f"minisgl bench serve: {server.url}/v1/models answered HTTP 401: ")
    assert no_key.stderr.endswith(" (--api-key?)\n") and "b'" not in no_key.stderr, no_key.stderr


def test_bench_serve_takes_the_api_key_from_the_environment_as_shell_does(server) -> None:
    """MINISGL_API_KEY (README: the key in the environment, not on the command line) was ignored:
    HTTP 401 and exit code 1, while `minisgl shell --url` took it. --api-key still wins."""
    proc = bench("--url", server.url, *SMALL, api_key_env=API_KEY)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["output_tokens"] == 4 * 4
    wrong = bench("--url", server.url, "--api-key", "wrong", *SMALL, api_key_env=API_KEY)
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr, wrong.stderr


def test_bench_serve_refuses_a_url_without_an_http_scheme_up_front() -> None:
    """``--url localhost:31200`` said "cannot reach the server ... start it first" while it ran; a
    port no number or out of range, or a broken IPv6 host, was httpx's traceback or that line too;
    a host name part past 63 characters or an empty one, UnicodeError's."""
    for url, said in [
        ("localhost:31200", "argument --url: needs a scheme: http://localhost:31200"),
        ("ftp://localhost:31200", "argument --url: must be an http:// or https:// URL, not ftp://: "
         "http://localhost:31200"),
        # (httpx's InvalidURL tracebacks; "cannot reach the server ... start it first")
        ("http://127.0.0.1:abc", "argument --url: is not a URL (Port could not be cast to integer value as "
         "'abc'), got 'http://127.0.0.1:abc': e.g. http://127.0.0.1:8000"),
        ("http://[::1", "argument --url: is not a URL (Invalid IPv6 URL), got 'http://[::1': e.g. http://127.0.0.1:8000"),
        ("http://127.0.0.1:99999", "argument --url: is not a URL (Port out of range 0-65535), got "
         "'http://127.0.0.1:99999': e.g. http://127.0.0.1:8000"),
        ("http://127.0.0.1:0", "argument --url: the port must be a number from 1 to 65535, got 'http://127.0.0.1:0'"),
        # (a host name the lookup's IDNA encoding refuses: UnicodeError's traceback)
        ("http://a..b:9", "argument --url: the host name has a part longer than 63 characters or an empty "
         "one; give the server's address, got 'http://a..b:9'"),
        ("http://" + "a" * 300, "argument --url: the host name has a part longer than 63 characters or an "
         f"empty one; give the server's address, got 'http://{'a' * 70}...'"),
    ]:  # fmt: skip
        proc = bench("--url", url, *SMALL)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].endswith(said), proc.stderr
        assert "cannot reach" not in proc.stderr


def test_bench_serve_against_no_minisgl_server_is_one_line() -> None:
    """A /v1/models answer that is not JSON was a JSONDecodeError traceback; a JSON list, not an
    object, an AttributeError one."""
    for models in [b"<html>hello</html>", b"[1, 2]"]:
        with fake_server(models) as server:
            proc = bench("--url", server.url, *SMALL)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr == (
            f"minisgl bench serve: {server.url}/v1/models answered {models.decode()!r}, not a list of models; "
            "is it a minisgl (OpenAI-compatible) server?\n"
        )
        assert server.chats == []


def test_fit_vocab_keeps_lengths_and_shared_prefixes() -> None:
    workload = shared_prefix(groups=2, prompts_per_group=2, prefix_len=16, question_len=4, vocab=10000)
    fitted = fit_vocab(workload, 100)
    assert [len(r.prompt_ids) for r in fitted] == [len(r.prompt_ids) for r in workload]
    assert all(0 <= t < 100 for r in fitted for t in r.prompt_ids)
    assert fitted[0].prompt_ids[:16] == fitted[2].prompt_ids[:16]  # same group, same prefix
    assert fit_vocab(workload, None) is workload and fit_vocab(workload, 10000) is workload
    check_context([BenchRequest([1] * 10, 6)], ServedModel("m", 100, 16))  # fits exactly
    # one token more: what to change names the KV pool too (only --max-context-len was named, where
    # a server's --num-kv-tokens was the bound)
    with pytest.raises(
        BenchError, match=r"smaller of its --max-context-len and its KV pool, --num-kv-tokens"
    ):
        check_context([BenchRequest([1] * 10, 7)], ServedModel("m", 100, 16))


def bench_here(capsys, *args: str, command: str = "serve") -> tuple[int, str]:
    """``minisgl bench COMMAND ARGS`` in this process (a refusal before any work: what a
    subprocess would show, without its ~2 s of imports): exit code and stderr."""
    from minisgl_core.cli import main

    capsys.readouterr()
    try:
        code = main(["bench", command, *args])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    if isinstance(code, str):  # SystemExit("message"): the interpreter prints it, exit status 1
        return 1, err + code + "\n"
    return code, err


def test_bench_serve_sizes_below_one_are_a_usage_error(capsys) -> None:
    # --groups 0 once divided by zero after the run, in the ideal hit rate
    for flag in ("--groups", "--prompts-per-group", "--prefix-len", "--output-len", "--num-requests"):
        code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", flag, "0")
        assert code == 2 and f"argument {flag}: must be an integer >= 1, got 0" in err, err
    # the command itself, once: the exit code and a stderr without a traceback
    proc = bench("--url", "http://127.0.0.1:9", "--groups", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "argument --groups: must be an integer >= 1, got 0" in proc.stderr


def test_bench_serve_refuses_a_workload_too_large_to_build_and_bad_sweeps(capsys) -> None:
    # each of these once ran for minutes building prompts (4-5 GB in 30 s) or died in a traceback
    too_large = {
        ("--num-requests", "1000000000"): "lower --num-requests",
        ("--workload", "shared-prefix", "--groups", "100000000"): "lower --groups, --prompts-per-group",
        ("--workload", "shared-prefix", "--prefix-len", "10000000000"): "lower --groups, --prompts-per-group",
    }
    for args, fix in too_large.items():
        code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", *args)
        assert code == 2 and "minisgl bench serve: error: the workload would hold up to " in err, err
        assert "prompt tokens, more than the 33,554,432 a bench builds; " + fix in err, err
    for flag, value in (("--concurrency", "abc"), ("--concurrency", "4,0"), ("--request-rate", "-1"),
                        ("--request-rate", "nan"), ("--request-rate", "2,x")):  # fmt: skip
        code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", flag, value)
        assert code == 2 and f"argument {flag}: must be" in err and repr(value) in err, err
    proc = bench("--url", "http://127.0.0.1:9", "--num-requests", "1000000000")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "more than the 33,554,432 a bench builds; lower --num-requests" in proc.stderr, proc.stderr


def test_bench_serve_refuses_a_request_rate_whose_arrivals_take_more_than_a_day(capsys) -> None:
    """``--request-rate 1e-300`` was taken: the bench sent its first request, then waited for the
    next until killed. Refused before the server is reached, with the least rate it takes."""
    for rates, rate in (("1e-300", "1e-300"), ("4,0.001", "0.001")):
        code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", "--request-rate", rates)
        assert code == 2 and err.splitlines()[-1].startswith(
            f"minisgl: error: --request-rate {rate}: the 256 requests would take "
        ), err
        assert err.endswith(
            "hours to arrive on average, more than the 24 hours a bench waits; give at least 0.00296 "
            "requests/s (or fewer requests)\n"
        ), err
    code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", "--request-rate", "0.00296")
    assert code == 1 and "cannot reach the server" in err, err  # (the least it takes: on to the server)
    code, err = bench_here(
        capsys, "--url", "http://127.0.0.1:9", "--num-requests", "1", "--request-rate", "1e-300"
    )
    assert code == 1 and "cannot reach the server" in err, err  # (one request: no wait between two)


def test_latency_percentiles_interpolate_as_numpy_does() -> None:
    import numpy as np
    import pytest

    from minisgl_core.bench.serve import percentile

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = rng.exponential(20.0, n).tolist()
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q)), (n, q)
    assert percentile([], 50) is None  # no samples: JSON null (NaN is not JSON)
    assert percentile([1.23456, 2.0], 0, 2) == 1.23


def test_bench_serve_sends_text_prompts_decoded_by_the_tokenizer(server, model_dir) -> None:
    """--tokenizer: the prompts go as text (what mini-sglang's server takes); our server tokenizes
    them back to the workload's lengths exactly (decoded ids once came back 2.6x longer), every
    request gets its tokens, and the shared prefixes still hit the cache. Another --seed: prefixes
    no earlier run cached (the hit rate stays at the workload's ideal, 0.43)."""
    args = (*SMALL, "--concurrency", "2", "--tokenizer", str(model_dir), "--seed", "7")
    proc = bench("--url", server.url, "--api-key", API_KEY, *args)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["text_prompts"] is True and result["server"] == "minisgl"
    assert result["output_tokens"] == result["expected_output_tokens"] == 4 * 4
    assert result["short_requests"] == 0
    assert result["prompt_tokens_served"] == result["prompt_tokens"] == 4 * (48 + 8)
    assert result["ideal_hit_rate"] == 0.4286
    assert 0.3 < result["prefix_hit_rate"] <= result["ideal_hit_rate"] + 0.02, result


def test_each_sweep_point_runs_on_prompts_no_earlier_point_cached(server) -> None:
    """``--concurrency 2,2``: the second point ran the first's prompts on the cache the first left
    warm, every prefix a hit (its hit rate ≈ 1, not the workload's 0.43). Each point after the first
    moves the ids round the vocabulary: same lengths and sharing, its hit rate the workload's own."""
    args = (*SMALL, "--concurrency", "2,2", "--seed", "11")
    proc = bench("--url", server.url, "--api-key", API_KEY, *args)
    assert proc.returncode == 0, proc.stderr
    first, second = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    for result in (first, second):
        assert result["prompt_tokens_served"] == 4 * (48 + 8) and result["output_tokens"] == 4 * 4
        assert 0 < result["prefix_hit_rate"] <= result["ideal_hit_rate"] + 0.02, result
    assert "prompt_ids_shifted_by" not in first and second["prompt_ids_shifted_by"] == 1


def test_a_sweep_point_keeps_the_workloads_lengths_and_sharing() -> None:
    from minisgl_core.bench.serve import for_sweep_point

    requests = shared_prefix(groups=2, prompts_per_group=2, prefix_len=6, question_len=2, output_len=3)
    assert for_sweep_point(requests, 0, 50) is requests
    moved = for_sweep_point(requests, 3, 50)
    assert [len(r.prompt_ids) for r in moved] == [len(r.prompt_ids) for r in requests]
    assert [r.max_tokens for r in moved] == [r.max_tokens for r in requests]
    assert all(m == (t + 3) % 50 for r, s in zip(requests, moved) for t, m in zip(r.prompt_ids, s.prompt_ids))
    assert moved[0].prompt_ids[:6] == moved[2].prompt_ids[:6] != requests[0].prompt_ids[:6]
    assert max(t for r in for_sweep_point(requests, 2, None) for t in r.prompt_ids) < 10_000 + 3


def test_mini_sglang_requests_and_chunks() -> None:
    """mini-sglang's server (20fcd7f, server/api_server.py): a text ``prompt`` at
    /v1/chat/completions; it streams one chunk per generated token (its detokenizer answers each
    token's message with one reply, content possibly empty while a character is incomplete), then
    a chunk with ``finish_reason`` "stop" and an empty delta, then [DONE]; no usage."""
    req = BenchRequest([5, 6, 7], 3)
    path, body = request_body("mini-sglang", "m", req, "some text")
    assert path == "/v1/chat/completions" and body["prompt"] == "some text" and body["stream"] is True
    assert "stream_options" not in body and body["ignore_eos"] is True and body["max_tokens"] == 3
    with pytest.raises(BenchError, match="--tokenizer"):
        request_body("mini-sglang", "m", req, None)
    stream = [
        {"id": "cmpl-1", "object": "text_completion.chunk",
         "choices": [{"delta": {"role": "assistant", "content": "He"}, "index": 0, "finish_reason": None}]},
        {"id": "cmpl-1", "object": "text_completion.chunk",
         "choices": [{"delta": {}, "index": 0, "finish_reason": None}]},
        {"id": "cmpl-1", "object": "text_completion.chunk",
         "choices": [{"delta": {"content": "llo"}, "index": 0, "finish_reason": None}]},
        {"id": "cmpl-1", "object": "text_completion.chunk",
         "choices": [{"delta": {}, "index": 0, "finish_reason": "stop"}]},
    ]  # fmt: skip
    assert [chunk_tokens("mini-sglang", c) for c in stream] == [(True, None)] * 3 + [(False, None)]
    # ours: token ids at /v1/completions, the count from the usage chunk
    path, body = request_body("minisgl", "m", req, None)
    assert (
        path == "/v1/completions" and body["prompt"] == [5, 6, 7] and body["stream_options"]["include_usage"]
    )
    assert chunk_tokens("minisgl", {"choices": [], "usage": {"completion_tokens": 3}}) == (False, 3)


def test_short_requests_counts_the_requests_that_returned_fewer_tokens() -> None:
    requests = [BenchRequest([1], 3), BenchRequest([2], 4), BenchRequest([3], 5)]
    results = [{"output_tokens": n} for n in (3, 3, 5)]  # the second stream lost one token
    assert short_requests(results, requests) == 1
    assert short_requests([{"output_tokens": n} for n in (2, 3, 4)], requests) == 3
    assert short_requests([{"output_tokens": n} for n in (3, 4, 5)], requests) == 0


def test_the_tokenizer_of_a_gguf_model_loads_from_its_folder_or_file(default_model_dir) -> None:
    """--tokenizer with the default model's folder (a .gguf file, no tokenizer files), as the
    README says, was "cannot load a tokenizer ... sentencepiece or tiktoken"; the engine's own
    loading reads it, from the folder or the file."""
    from minisgl_core.testing.real_model import gguf_file

    workload = shared_prefix(groups=2, prompts_per_group=2, prefix_len=16, question_len=4, vocab=49_152)
    for path in (default_model_dir, gguf_file(default_model_dir)):
        texts = prompt_texts(workload, str(path))  # (it checks the texts encode back to 20 tokens)
        assert len(texts) == 4 and texts[0] != texts[1] and texts[0].startswith(" ")


def test_bench_serve_names_a_tokenizer_it_cannot_load(server, tmp_path) -> None:
    for folder, says in (
        (tmp_path / "none", "no such file or folder"),
        (tmp_path, "cannot load a tokenizer from"),
    ):
        proc = bench("--url", server.url, "--api-key", API_KEY, *SMALL, "--tokenizer", str(folder))
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("minisgl bench serve: ") and says in lines[0], lines


def test_bench_serve_against_mini_sglang_needs_a_tokenizer() -> None:
    proc = bench("--url", "http://127.0.0.1:9", "--server", "mini-sglang", *SMALL)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "mini-sglang's server takes text prompts only: add --tokenizer DIR" in proc.stderr


def test_bench_flags_refused_once_parsed_are_usage_errors(capsys) -> None:
    """A usage error exits 2, as argparse's own: these exited 1 (a failed run's status) with a line
    not saying error: a script could not tell a bad command line from a run that failed."""
    for args, says in [
        (["--server", "mini-sglang"], "mini-sglang's server takes text prompts only: add --tokenizer DIR "
         "(the served model's folder)"),
        (["--api-key", "clé"], "--api-key (or MINISGL_API_KEY) holds 'é', which an HTTP header cannot carry: "
         "use printable ASCII characters only"),
        (["--num-requests", "1000000000"], "the workload would hold up to 1,024,000,000,000 prompt tokens, "
         "more than the 33,554,432 a bench builds; lower --num-requests"),
    ]:  # fmt: skip
        code, err = bench_here(capsys, "--url", "http://127.0.0.1:9", *args)
        assert (code, err) == (2, f"minisgl bench serve: error: {says}\n"), err


def test_text_prompts_encode_back_to_the_workload_exactly(tmp_path) -> None:
    """A bench model's tokenizer (4,096 trained tokens padded with filler words to the shape's
    vocabulary): the ids' own text re-encoded 2.6x longer; the whole-word texts encode back to the
    same lengths, equal ids to equal tokens (shared prefixes stay shared)."""
    from transformers import AutoTokenizer

    from minisgl_core.bench.grammar import bench_tokenizer

    folder = bench_tokenizer(20_000, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    workload = shared_prefix(groups=3, prompts_per_group=2, prefix_len=200, question_len=20, vocab=20_000)
    naive = tokenizer(tokenizer.decode(workload[0].prompt_ids), add_special_tokens=False)["input_ids"]
    assert len(naive) > 1.5 * 220  # what the texts were before
    texts = prompt_texts(workload, str(folder))
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert [len(ids) for ids in encoded] == [220] * 6
    assert encoded[0][:200] == encoded[3][:200] and encoded[0][200:] != encoded[3][200:]  # same group
    assert encoded[0][:200] != encoded[1][:200]  # another group
    words = whole_words(tokenizer)
    assert len(words) >= 64 and all(w[0] == " " and w[1:].isalpha() for w in words)


def test_files_a_bench_writes_are_checked_before_it_runs(tmp_path, capsys) -> None:
    """--output, --trace and --profile into a missing directory failed with a traceback after the
    run (minutes of measuring on a GPU), the result lost."""
    runs = [
        (["serve", "--url", "http://127.0.0.1:9", "--output", str(tmp_path / "no" / "x.json")], "--output"),
        (["serve", "--url", "http://127.0.0.1:9", "--trace", str(tmp_path)], "--trace"),
        (["offline", "--num-requests", "1", "--profile", str(tmp_path / "no" / "p.txt")], "--profile"),
        (["grammar", "--output", str(tmp_path / "no" / "x.json")], "--output"),
    ]
    for (command, *args), flag in runs:
        code, err = bench_here(capsys, *args, command=command)
        assert code == 2 and f"argument {flag}: " in err, err
        assert "no directory" in err or "is a directory" in err, err
    # the command itself, once: the exit code and a stderr without a traceback
    proc = run_cli(["bench", *runs[2][0]])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "argument --profile: " in proc.stderr and "no directory" in proc.stderr, proc.stderr


def test_an_empty_file_name_is_refused_as_empty(capsys) -> None:
    """``--output ''`` was refused as " is a directory, not a file" (the working directory, unnamed),
    ``--grammar-schema ''`` as "cannot read : Is a directory"; each now says it is empty."""
    runs = [
        (["serve", "--url", "http://127.0.0.1:9", "--output", ""], "--output", "the file to write"),
        (["serve", "--url", "http://127.0.0.1:9", "--trace", " "], "--trace", "the file to write"),
        (["offline", "--profile", ""], "--profile", "the file to write"),
        (["grammar", "--output", ""], "--output", "the file to write"),
        (["grammar", "--grammar-schema", ""], "--grammar-schema", "a JSON schema file, or builtin"),
        (["offline", "--grammar-schema", ""], "--grammar-schema", "a JSON schema file, or builtin"),
    ]
    for (command, *args), flag, what in runs:
        code, err = bench_here(capsys, *args, command=command)
        assert (
            code == 2
            and err
            == f"minisgl bench {command}: error: argument {flag}: is empty: give {what}"
            + (", or leave the flag out\n" if what == "the file to write" else "\n")
        ), err


def test_output_files_the_bench_could_not_write_are_refused_before_the_run(tmp_path) -> None:
    """``os.access`` said yes to root for /proc's and /sys's files and folders, and the write failed
    (or, in /sys, could act) after the run; a FIFO with no reader would hang the write. Each is now
    tried before the run; a file that can be written still passes, untouched."""
    import argparse
    import os
    import stat

    from minisgl_core.bench.cli import _model_cache, _writable

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    kept = tmp_path / "kept.jsonl"
    kept.write_text("{}\n")
    refused = ["/proc/version", "/proc/minisgl-result.json", "/sys/minisgl-result.json", str(fifo)]
    sys_file = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(sys_file):
        refused.append(sys_file)
    for path in refused:
        with pytest.raises(argparse.ArgumentTypeError, match=f"cannot write {path}: "):
            _writable(path)
    for folder in ("/proc", "/sys"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"cannot write {folder}/minisgl-models: "):
            _model_cache(f"{folder}/minisgl-models")
    assert _writable(str(kept)) == str(kept) and kept.read_text() == "{}\n"
    assert _writable(str(tmp_path / "new.jsonl")) and not (tmp_path / "new.jsonl").exists()
    assert _model_cache(str(tmp_path / "models")) and sorted(tmp_path.iterdir()) == sorted([fifo, kept])
    assert _writable(os.devnull) == os.devnull
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_file_name_too_long_to_look_up_is_one_line(capsys) -> None:
    """A name past the file system's limit (ENAMETOOLONG) was os.stat's OSError traceback from the
    benches' --output, --profile, --trace and --model-cache (pathlib's exists and is_dir raise it):
    now argparse's line for the flag, the name cut short."""
    long_name = "x" * 300
    runs = [
        ("offline", "--output"), ("offline", "--profile"), ("offline", "--model-cache"),
        ("serve", "--trace"), ("grammar", "--model-cache"), ("cpu", "--output"),
    ]  # fmt: skip
    for command, flag in runs:
        for path in (long_name, f"/tmp/{long_name}/result.jsonl"):
            code, err = bench_here(capsys, flag, path, command=command)
            assert code == 2, err
            line = err.splitlines()[-1]
            assert line.startswith(f"minisgl bench {command}: error: argument {flag}: cannot write "), err
            assert line.endswith("...: file name too long") and len(line) < 200, err


def test_a_model_cache_that_is_a_file_or_in_no_directory_is_one_line(tmp_path, capsys) -> None:
    """--model-cache at a file was a NotADirectoryError traceback (bench grammar, and bench offline
    --shape after its checks); one in a missing directory was made, every folder up to / (grammar)."""
    a_file = tmp_path / "file"
    a_file.write_text("")
    missing = tmp_path / "no" / "cache"
    runs = [
        ("grammar", ["--rows", "2", "--steps", "2", "--vocab-size", "4096"]),
        ("offline", ["--shape", "qwen3-0.6b", "--num-requests", "1"]),
    ]
    for command, args in runs:
        for cache, says in [(a_file, f"{a_file} is not a directory"),
                            (missing, f"cannot write {missing}: no directory {missing.parent}")]:  # fmt: skip
            code, err = bench_here(capsys, *args, "--model-cache", str(cache), command=command)
            assert code == 2, err
            assert (
                err.splitlines()[-1] == f"minisgl bench {command}: error: argument --model-cache: {says}"
            ), err
    assert not missing.parent.exists()


def test_the_commit_a_bench_records_is_this_checkouts_not_the_working_directorys(tmp_path, monkeypatch):
    """Run from another directory (another repository, or none) the result named that one's commit, or '?'."""
    import argparse
    from pathlib import Path

    from minisgl_core.bench.cli import _meta

    here = Path(__file__).resolve().parent
    ours = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if ours.returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.delenv("MINISGL_COMMIT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert _meta(argparse.Namespace(label=""))["commit"] == ours.stdout.strip()


def test_bench_offline_on_a_cpu_warns_first_that_it_is_a_gpu_benchmark(model_dir) -> None:
    """``bench offline --shape qwen3-0.6b`` on a CPU built the model and ran 256 requests for many
    minutes without a word. (The tiny model's vocabulary then stops the run: the workload's ids
    are past it.)"""

    def offline(*args: str) -> subprocess.CompletedProcess:
        return run_cli(["bench", "offline", "--model", str(model_dir), *args], timeout=180)

    proc = offline("--device", "cpu")
    first = proc.stderr.splitlines()[0]
    assert first.startswith("minisgl bench offline: warning: a GPU benchmark (256 requests"), proc.stderr
    assert "takes long on a CPU: add --num-requests 8" in first and "minisgl bench cpu" in first
    small = offline("--device", "cpu", "--num-requests", "8")
    assert "warning" not in small.stderr and "has a vocabulary of" in small.stderr, small.stderr
    # a refused flag stays one line: the warning comes after every check
    refused = offline("--device", "cpu", "--tp", "2", "--grammar-schema", "builtin")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "minisgl: error: --grammar-schema runs with --tp 1 only"
    ], refused.stderr


def test_bench_cpu_records_the_engine_options_flags_gave_and_refuses_a_contradicting_engine_arg(
    model_dir, tmp_path
) -> None:
    """``bench cpu --quantization int8 --engine-arg quantization=int4`` ran int4 without a word, and
    the JSON named only the --engine-arg: a flag-given option was in no result."""

    def cpu(*args: str) -> subprocess.CompletedProcess:
        return run_cli(["bench", "cpu", "--model", str(model_dir), "--no-transformers", *args], timeout=180)

    refused = cpu("--quantization", "int8", "--engine-arg", "quantization=int4")
    assert refused.returncode == 2 and refused.stderr.splitlines()[-1] == (
        "minisgl: error: --engine-arg quantization='int4' contradicts --quantization int8: give one of them"
    ), refused.stderr
    # a long value is cut short in the message (a 5,000-digit one was echoed whole)
    huge = cpu("--max-running-requests", "4", "--engine-arg", "max_running_requests=" + "9" * 5000)
    assert huge.returncode == 2 and len(huge.stderr.splitlines()[-1]) < 200, huge.stderr[-300:]
    out = tmp_path / "cpu.jsonl"
    small = ["--batch-sizes", "1", "--max-new-tokens", "2", "--rounds", "1", "--output", str(out)]
    proc = cpu(*small, "--quantization", "int8", "--page-size", "4", "--engine-arg", "quantization=int8")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["engine_args"] == ["quantization=int8"]
    assert result["engine_options"]["quantization"] == "int8" and result["engine_options"]["page_size"] == 4
    assert "attn" not in result["engine_options"]  # (the default: not recorded)


def test_bench_cpu_refuses_a_batch_larger_than_the_engine_runs_at_once(model_dir, capsys) -> None:
    """``bench cpu --batch-sizes 1000`` timed our engine running 256 at a time (--max-running-requests)
    against transformers' one batch of 1,000, under one batch_size; 99999999999999999999 built its
    prompts until killed. Refused before the model loads, naming both flags."""
    import torch

    threads = torch.get_num_threads()  # (bench cpu sets torch's threads in this process)
    try:
        for args, largest, running in [
            (["--batch-sizes", "1,300"], 300, 256),
            (["--batch-sizes", "99999999999999999999"], 99999999999999999999, 256),
            (["--batch-sizes", "8", "--max-running-requests", "4"], 8, 4),
            (["--batch-sizes", "8", "--engine-arg", "max_running_requests=4"], 8, 4),
        ]:
            short = ["--no-transformers", "--max-new-tokens", "1", "--rounds", "1", "--threads", "1"]
            code, err = bench_here(
                capsys, "--model", str(model_dir), "--device", "cpu", *short, *args, command="cpu"
            )
            assert code == 2, err
            assert err.splitlines()[-1] == (
                f"minisgl: error: --batch-sizes {largest}: more than --max-running-requests {running}, the "
                "requests the engine runs at once (a larger batch is not timed as one); lower it or raise "
                "--max-running-requests"
            ), err
    finally:
        torch.set_num_threads(threads)


def test_bench_cpu_checks_engine_arg_values_before_comparing_them(model_dir, capsys) -> None:
    """``--engine-arg max_running_requests=abc`` was a TypeError traceback (compared with the largest
    batch size before the engine checked it), ``=-1`` "--batch-sizes 1: more than
    --max-running-requests -1": each is now the engine's own one-line refusal."""
    import torch

    threads = torch.get_num_threads()  # (bench cpu sets torch's threads in this process)
    try:
        for value, says in [
            ("abc", "--max-running-requests must be an integer, got 'abc'"),
            ("-1", "--max-running-requests must be >= 1, got -1"),
        ]:
            code, err = bench_here(
                capsys, "--model", str(model_dir), "--device", "cpu", "--no-transformers", "--threads", "1",
                "--batch-sizes", "1", "--engine-arg", f"max_running_requests={value}", command="cpu",
            )  # fmt: skip
            assert code == 2 and err.splitlines()[-1] == f"minisgl: error: {says}", err
    finally:
        torch.set_num_threads(threads)


def test_bench_grammar_refuses_more_logits_than_it_allocates(tmp_path, capsys, monkeypatch) -> None:
    """``bench grammar --rows 99999999999999999999`` ran until killed (a request per row, then a
    rows x vocabulary logits tensor each step), as did a --vocab-size as large (filler words padding
    its tokenizer): the product is refused before any work, naming both flags."""
    import minisgl_core.bench.grammar as grammar

    def ran(*args, **kwargs):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(grammar, "host_step_bench", ran)
    for rows, vocab in [(99999999999999999999, 151936), (8000, 151936), (1, 99999999999999999999)]:
        code, err = bench_here(
            capsys, "--rows", str(rows), "--vocab-size", str(vocab), "--model-cache", str(tmp_path),
            command="grammar",
        )  # fmt: skip
        assert code == 2, err
        assert err.splitlines()[-1] == (
            f"minisgl: error: --rows {rows} x --vocab-size {vocab}: each step would draw {rows * vocab:,} "
            "logits, more than the 1,073,741,824 (4 GiB) a bench allocates; lower --rows or --vocab-size"
        ), err
    with pytest.raises(AssertionError, match="the bench ran"):  # (the largest it takes: 7,067 x Qwen3's)
        bench_here(capsys, "--rows", "7067", "--model-cache", str(tmp_path), command="grammar")


def test_bench_grammar_max_tokens_past_a_schemas_min_items_names_the_flag(
    tmp_path, capsys, monkeypatch
) -> None:
    """``bench grammar --max-tokens 99999999999999999999`` was "argument --grammar-schema: builtin:
    invalid json_schema grammar: minItems must be an integer" (xgrammar takes up to 2**31 - 1):
    the flag at fault is named, with its range, before any work."""
    import minisgl_core.bench.grammar as grammar

    def ran(*args, **kwargs):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(grammar, "host_step_bench", ran)
    for value in ("99999999999999999999", "2147483648", "0", "abc"):
        code, err = bench_here(
            capsys, "--max-tokens", value, "--model-cache", str(tmp_path), command="grammar"
        )
        assert code == 2, err
        assert err.splitlines()[-1] == (
            "minisgl bench grammar: error: argument --max-tokens: must be an integer from 1 to 2147483647 "
            f"(the builtin schema's minItems), got {value}"
        ), err
    with pytest.raises(AssertionError, match="the bench ran"):
        bench_here(capsys, "--max-tokens", "2147483647", "--model-cache", str(tmp_path), command="grammar")


def test_bench_step_and_round_counts_past_their_limit_are_a_usage_error(
    model_dir, tmp_path, capsys, monkeypatch
) -> None:
    """``bench grammar --steps 99999999999999999999`` (or --warm-steps) and ``bench cpu --rounds``
    as large were taken, and the bench then ran until killed: refused before any work, naming the
    flag and its range; the largest each takes still runs."""
    import torch

    import minisgl_core.bench.cpu as cpu
    import minisgl_core.bench.grammar as grammar

    def ran(*args, **kwargs):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(grammar, "host_step_bench", ran)
    monkeypatch.setattr(cpu, "run_cpu_bench", ran)
    grammar_args = ["--rows", "2", "--vocab-size", "4096", "--model-cache", str(tmp_path)]
    cpu_args = ["--model", str(model_dir), "--device", "cpu", "--no-transformers", "--threads", "1",
                "--batch-sizes", "1", "--max-new-tokens", "1"]  # fmt: skip
    cases = [("grammar", grammar_args, "--steps", "1 to 100,000"),
             ("grammar", grammar_args, "--warm-steps", "0 to 100,000"),
             ("cpu", cpu_args, "--rounds", "1 to 1,000")]  # fmt: skip
    threads = torch.get_num_threads()  # (bench cpu sets torch's threads in this process)
    try:
        for command, args, flag, limit in cases:
            for value in ("99999999999999999999", str(int(limit.split()[-1].replace(",", "")) + 1)):
                code, err = bench_here(capsys, *args, flag, value, command=command)
                assert code == 2 and err.splitlines()[-1] == (
                    f"minisgl bench {command}: error: argument {flag}: must be an integer from {limit}, got {value}"
                ), err
            with pytest.raises(AssertionError, match="the bench ran"):
                bench_here(capsys, *args, flag, limit.split()[-1].replace(",", ""), command=command)
    finally:
        torch.set_num_threads(threads)


def _streaming_server(events: bytes | None):
    """An HTTP server listing model "m" (/v1/models), with empty /metrics, that answers each chat
    or completion with a 200 event stream of ``events`` (then closes the connection; None: a
    chunked body cut off part-way)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = (
                b'{"data": [{"id": "m", "vocab_size": 1000, "max_model_len": 4096}]}'
                if "models" in self.path
                else b""
            )
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            if events is None:  # a body cut short, as a server killed mid-reply would leave it
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"40\r\ndata: {" if events is None else events)
            self.close_connection = True

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'


@pytest.mark.parametrize(
    ("events", "says"),
    [
        # (counted as 0 tokens: exit 0 with "output_tokens": 0 and no word of the error)
        (CHUNK + b'data: {"error": {"message": "the engine failed"}}\n\ndata: [DONE]\n\n',
         "the server answered an error mid-stream: the engine failed"),
        (CHUNK + b"data: {not json\n\n", "the server sent an event that is not JSON: 'data: {not json'"),
        # (a body cut short, as a server killed mid-reply: httpx's RemoteProtocolError traceback)
        (None, "lost the server at "),
    ],
)  # fmt: skip
def test_bench_serve_says_what_went_wrong_mid_stream_in_one_line(events, says) -> None:
    server, url = _streaming_server(events)
    try:
        proc = bench("--url", url, *SMALL)
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().startswith(f"minisgl bench serve: {says}"), proc.stderr
