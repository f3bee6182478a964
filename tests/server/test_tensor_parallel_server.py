"""``serve --tp 2`` on CPU (gloo): same greedy outputs as TP 1, idle without spinning, clean SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from minisgl_core.tokenizer.load import apply_chat_template

from .conftest import metrics

PROMPTS = ["The quick brown fox jumps over", "Once upon a time", "In a hole in the ground there lived"]


@pytest.fixture(scope="module")
def tp2(start_server, model_dir, engine_args):
    return start_server(["--model", str(model_dir), "--tp", "2", *engine_args])


def test_tp2_equals_tp1(tp2, client, model_name, llm):
    c2 = openai.OpenAI(base_url=f"{tp2.url}/v1", api_key="unused", max_retries=0, timeout=120)
    one = client.completions.create(
        model=model_name, prompt=PROMPTS, max_tokens=10, temperature=0, logprobs=2
    )
    two = c2.completions.create(model=model_name, prompt=PROMPTS, max_tokens=10, temperature=0, logprobs=2)
    if os.environ.get("MINISGL_TEST_DEVICE", "cpu") == "cpu":
        assert [c.text for c in two.choices] == [c.text for c in one.choices]
    else:
        for a, b in zip(one.choices, two.choices, strict=True):
            _agree_up_to_a_near_tie(a.logprobs, b.logprobs)
    # (the usage's cached tokens are each server's own prefix cache's: compared below)
    assert two.usage.model_dump(exclude={"prompt_tokens_details"}) == one.usage.model_dump(
        exclude={"prompt_tokens_details"}
    )
    # rank 0 reports the prefix cache's hits, as every rank admits alike: the same prompts again
    again = c2.completions.create(model=model_name, prompt=PROMPTS, max_tokens=10, temperature=0).usage
    assert 0 < again.prompt_tokens_details.cached_tokens < again.prompt_tokens
    # /flush_cache empties every rank's cache in the same step: the prompts are computed whole again,
    # to the same tokens, and the ranks stay in step
    assert httpx.post(f"{tp2.url}/flush_cache", timeout=60).json()["flushed_tokens"] > 0
    flushed = c2.completions.create(model=model_name, prompt=PROMPTS, max_tokens=10, temperature=0)
    assert flushed.usage.prompt_tokens_details.cached_tokens == 0
    assert [c.text for c in flushed.choices] == [c.text for c in two.choices]
    # rank 0 alone logs the flush (each rank logged it; rank 1 has flushed by now: it ran that request)
    tp2.wait_for_log("prefix cache flushed")
    assert tp2.log().count("prefix cache flushed") == 1, tp2.log()[-3000:]
    messages = [{"role": "user", "content": "Where is the sea?"}]
    chat1 = client.chat.completions.create(model=model_name, messages=messages, max_tokens=8, temperature=0)
    chat2 = c2.chat.completions.create(
        model=model_name, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat2) == chat1.choices[0].message.content
    assert len(apply_chat_template(llm.tokenizer, messages)) == chat1.usage.prompt_tokens


def _agree_up_to_a_near_tie(one, two) -> None:
    """On CUDA the ranks' split GEMMs round apart from one GPU's (bf16 logits, steps of 1/64 near
    -4): the tiny random model's greedy tokens may part where one server saw two tokens (nearly)
    tied, never elsewhere (probe on two H200s: a tie at -4.3405 at the seventh token)."""
    for i, (a, b) in enumerate(zip(one.tokens, two.tokens, strict=True)):
        assert one.token_logprobs[i] == pytest.approx(two.token_logprobs[i], abs=0.05)
        if a != b:
            top = one.top_logprobs[i]
            assert b in top and top[a] - top[b] <= 0.05, (i, a, b, top, two.top_logprobs[i])
            return


def test_tp2_abort_keeps_ranks_in_step(tp2, model_name):
    body = {"prompt": "A long story", "max_tokens": 300, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{tp2.url}/v1/completions", json=body, timeout=60) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i == 4:
                break
    # every rank applied the abort at the same step, or the next request would hang or diverge
    c2 = openai.OpenAI(base_url=f"{tp2.url}/v1", api_key="unused", max_retries=0, timeout=60)
    out = c2.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4


def test_tp2_grammars_compile_aside_and_every_rank_admits_them_in_step(tp2, model_name):
    """A grammar new to the server compiles off each rank's scheduler thread; rank 0 tells every
    rank in which step to admit the request (CompilesSettled), or the ranks would part."""
    c2 = openai.OpenAI(base_url=f"{tp2.url}/v1", api_key="unused", max_retries=0, timeout=120)
    patterns = ["[A-Z]{3}-[0-9]{4}", "(yes|no)", "[a-z]{2,5}"]
    outs = [
        c2.completions.create(
            model=model_name,
            prompt=PROMPTS[i],
            max_tokens=20,
            temperature=0,
            extra_body={"structured_outputs": {"regex": pattern}},
        )  # fmt: skip
        for i, pattern in enumerate(patterns)
    ]
    for pattern, out in zip(patterns, outs):
        assert re.fullmatch(pattern, out.choices[0].text), (pattern, out.choices[0].text)
    out = c2.completions.create(model=model_name, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4


def test_tp2_a_request_whose_allowed_ids_and_grammar_leave_no_token_is_a_400_logged_once(
    tp2, model_dir, model_name
):
    """allowed_token_ids that no JSON text can begin with, beside a json_schema: the engine finds
    it at the first token. It was a 400 with param null, and each rank logged it at ERROR as if
    the server had failed; streamed, the error event (the stream began before the compile) had
    param null too. Now the param names allowed_token_ids, and rank 0 alone logs it, at INFO."""
    from transformers import AutoTokenizer

    letters = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids(["a", "b", "c"])
    schema = {"type": "object", "properties": {"tp2_dead_end": {"type": "integer"}}}
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "allowed_token_ids": letters,
        "max_tokens": 8,
    }
    url = f"{tp2.url}/v1/chat/completions"
    whole = httpx.post(url, json=body, timeout=120)
    assert whole.status_code == 400, whole.text
    error = whole.json()["error"]
    assert error["param"] == "allowed_token_ids", error
    assert error["message"].startswith("no token is left to sample after 0 output token(s)"), error
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as streamed:
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert events[-1]["error"]["param"] == "allowed_token_ids", events
    assert events[-1]["error"]["type"] == "invalid_request_error", events
    tp2.wait_for_log("refused: no token is left")
    log = tp2.log()
    refusals = [line for line in log.splitlines() if "no token is left" in line]
    assert len(refusals) == 2, refusals  # one a request, rank 0's
    assert all(" INFO [scheduler 0] " in line for line in refusals), refusals


def test_idle_server_does_not_spin(tp2):
    children = tp2.children()
    # measured once rank 0's idle heartbeat has found every rank parked (/metrics), not before: a
    # rank may still be ending the last test's request on a loaded machine
    deadline = time.monotonic() + 60
    while metrics(tp2.url)["minisgl_idle_seconds"] == 0:
        assert time.monotonic() < deadline, "the server never said it was idle"
        time.sleep(0.05)
    before = tp2.cpu_seconds(children)
    time.sleep(2.0)
    # a rank polling in a loop would burn ~2 CPU seconds here; parked ones use almost none
    assert tp2.cpu_seconds(children) - before < 0.2


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _listening(table: str) -> dict[int, str]:
    """inode -> local address of every listening TCP socket in /proc/net/tcp or tcp6."""
    out = {}
    for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # TCP_LISTEN
            out[int(fields[9])] = fields[1]
    return out


def _is_loopback(hex_addr: str) -> bool:
    host = hex_addr.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian: 127.x.x.x ends in 7F
        return host.endswith("7F")
    return host == "00000000000000000000000001000000"  # ::1


def test_tp2_listens_on_loopback_only(tp2):
    tree = [tp2.proc.pid, *tp2.children()]
    inodes = set().union(*(_socket_inodes(pid) for pid in tree))
    listening = {**_listening("tcp"), **_listening("tcp6")}
    ours = {inode: addr for inode, addr in listening.items() if inode in inodes}
    assert ours, "expected the HTTP server and the TP rendezvous to listen"
    # nothing on 0.0.0.0, ::, or an outward address
    assert all(_is_loopback(addr) for addr in ours.values()), ours


def test_sigterm_stops_every_process(tp2):
    children = tp2.children()
    assert len(children) >= 4  # tokenizer, detokenizer, two scheduler ranks
    tp2.proc.send_signal(signal.SIGTERM)
    assert tp2.wait_exit(30) == 0
    tp2.assert_all_stopped(children)
    assert "Traceback" not in tp2.log() and "resource_tracker" not in tp2.log(), tp2.log()[-2000:]


def _rendezvous_addr() -> str:
    """--dist-init-addr for two "nodes" on this machine: a loopback port free now, below the kernel's
    range for connections' own ends, so that none can take it before node 0 binds it."""
    import random
    import socket

    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(10000, first_ephemeral), 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return f"127.0.0.1:{port}"
    raise RuntimeError("no free loopback port below the ephemeral range")


def _two_serving_nodes(start_server, model_dir, engine_args, *extra: str):
    """Node 0 and node 1 of one TP=2 group on this machine, both ready."""
    addr = _rendezvous_addr()
    common = [
        "--model",
        str(model_dir),
        "--tp",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        addr,
        *extra,
        *engine_args,
    ]
    node1 = start_server([*common, "--node-rank", "1"], wait=False)
    node0 = start_server([*common, "--node-rank", "0"])
    node1.wait_for_log("node 1 ready: scheduler ranks [1]")
    return node0, node1


def test_two_nodes(start_server, model_dir, engine_args, client, model_name):
    """--nnodes 2 on one machine: node 1 runs scheduler rank 1 only, node 0 everything else."""
    node0, node1 = _two_serving_nodes(start_server, model_dir, engine_args)
    for node, rank in ((node0, 0), (node1, 1)):  # what a node says while it waits for the others
        assert (
            f"node {rank} of 2 (scheduler ranks [{rank}]): waiting up to 10 minutes for every node"
            in node.log()
        )
    c0 = openai.OpenAI(base_url=f"{node0.url}/v1", api_key="unused", max_retries=0, timeout=120)
    one = client.completions.create(model=model_name, prompt=PROMPTS, max_tokens=6, temperature=0)
    two = c0.completions.create(model=model_name, prompt=PROMPTS, max_tokens=6, temperature=0)
    assert [c.text for c in two.choices] == [c.text for c in one.choices]
    node0.proc.send_signal(signal.SIGTERM)
    assert node0.wait_exit(30) == 0
    assert node1.wait_exit(30) == 0  # its rank left with the group; the node stops by itself
    assert node1.socket_dirs() == []


def _child_named(server, comm: str) -> int:
    for pid in server.children():
        if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
            return pid
    raise AssertionError(f"no child process {comm}")


def _stream_signalling(url: str, pid: int, sig: signal.Signals) -> tuple[list[str], float]:
    """A long streamed completion, ``sig`` sent to ``pid`` once its first event came: the stream's
    events (``data:`` payloads) and when the signal went."""
    body = {
        "prompt": "A long story",
        "max_tokens": 1800,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    events: list[str] = []
    sent = 0.0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                if not events:
                    os.kill(pid, sig)
                    sent = time.monotonic()
                events.append(line.removeprefix("data: "))
    return events, sent


def test_a_killed_rank_is_named_to_clients_and_its_peers_gloo_error_stays_in_the_log(
    start_server, model_dir, engine_args
):
    """SIGKILL of rank 1 reached clients as rank 0's gloo error, with the C++ source path of the
    build ("RuntimeError: [/pytorch/third_party/gloo/.../pair.cc:534] Connection closed by peer",
    found by a probe); they get which rank died and how, the log the rest."""
    server = start_server(["--model", str(model_dir), "--tp", "2", *engine_args])
    children = server.children()
    events, _ = _stream_signalling(server.url, _child_named(server, "minisgl-sched1"), signal.SIGKILL)
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["code"] == "server_unavailable", error
    assert error["message"] == (
        "the engine failed: tensor-parallel rank 1 exited with signal 9 (SIGKILL); see the server log"
    )
    # a new request gets the same words, unless the listener is already closed
    try:
        resp = httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 1}, timeout=10)
        assert resp.status_code == 503 and resp.json()["error"]["message"] == (
            "the server cannot take requests: " + error["message"]
        )
    except httpx.TransportError:
        pass
    assert server.wait_exit(30) != 0
    assert "the scheduler 1 process exited unexpectedly with code -9" in server.log()
    server.assert_all_stopped(children)


def test_an_idle_node_0_notices_a_dead_node_1(start_server, model_dir, engine_args):
    """Node 1's scheduler killed while nobody sends requests: node 0 finds out within seconds (an
    idle rank 0 checks its peers once a second), stops and says which rank it lost, rather than
    answering /health with 200 until the next request fails."""
    node0, node1 = _two_serving_nodes(start_server, model_dir, engine_args)
    assert httpx.get(f"{node0.url}/health", timeout=10).status_code == 200
    os.kill(_child_named(node1, "minisgl-sched1"), signal.SIGKILL)
    assert node0.wait_exit(30) != 0
    assert "lost tensor-parallel rank 1" in node0.log() and "Traceback" not in node0.log(), node0.log()[
        -3000:
    ]
    # and node 1 itself says its rank died (it exited with 0, silently, when the rank's exit came
    # between its launcher's look at the failure reports and its look at the exit codes)
    assert node1.wait_exit(30) != 0
    assert "the scheduler 1 process exited unexpectedly with code -9" in node1.log(), node1.log()[-3000:]


def test_a_frozen_node_1_mid_step_stops_node_0_within_the_peer_timeout(start_server, model_dir, engine_args):
    """Node 1's scheduler stopped (SIGSTOP: a frozen process or a node cut off) while a request
    streams: rank 0 waits in the step's collective with no error to see (gloo waits for ever; on
    GPUs NCCL waited its watchdog's ten minutes, /health 200 all along). Rank 0's peer watch gives
    rank 1 up after --tp-peer-timeout, and the client's stream ends with an error naming it."""
    node0, node1 = _two_serving_nodes(start_server, model_dir, engine_args, "--tp-peer-timeout", "3")
    rank1 = _child_named(node1, "minisgl-sched1")
    try:
        events, stopped_at = _stream_signalling(node0.url, rank1, signal.SIGSTOP)
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["code"] == "server_unavailable", error
        assert "lost tensor-parallel rank 1" in error["message"], error
        assert time.monotonic() - stopped_at < 20
        assert node0.wait_exit(30) != 0
        assert "lost tensor-parallel rank 1 (silent for 3 s)" in node0.log(), node0.log()[-3000:]
    finally:
        os.kill(rank1, signal.SIGCONT)
    # node 1, its rank going again, finds rank 0 gone and stops too
    assert node1.wait_exit(60) != 0


def test_a_frozen_node_0_stops_node_1_within_the_peer_timeout(start_server, model_dir, engine_args):
    """Node 0's scheduler stopped while idle: it hosts the rendezvous store, so node 1's rank finds
    the store silent and gives rank 0 up (it waited parked for ever before)."""
    node0, node1 = _two_serving_nodes(start_server, model_dir, engine_args, "--tp-peer-timeout", "3")
    rank0 = _child_named(node0, "minisgl-sched0")
    os.kill(rank0, signal.SIGSTOP)
    try:
        assert node1.wait_exit(30) != 0
        log = node1.log()
        assert "lost tensor-parallel rank 0 (its store has not answered for 3 s)" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    finally:
        os.kill(rank0, signal.SIGCONT)
    assert node0.wait_exit(30) != 0  # and node 0, going again, finds rank 1 gone


def test_nodes_started_with_different_settings_refuse_to_serve(start_server, model_dir, engine_args):
    """Node 1 started with another --max-running-requests and a fast path off: the ranks would
    schedule apart (a hang, or tokens computed from different batches). Both nodes stop at once,
    naming each setting and every rank's value."""
    addr = _rendezvous_addr()
    common = ["--model", str(model_dir), "--tp", "2", "--nnodes", "2", "--dist-init-addr", addr]
    # (a flag given twice: the last one counts)
    node1 = start_server(
        [*common, *engine_args, "--node-rank", "1", "--max-running-requests", "8",
         "--disable-fast-path", "triton_norm"], wait=False,
    )  # fmt: skip
    node0 = start_server(
        [*common, *engine_args, "--node-rank", "0", "--max-running-requests", "16"], wait=False
    )
    assert node0.wait_exit(120) != 0
    assert node1.wait_exit(30) != 0
    for log in (node0.log(), node1.log()):
        assert "the tensor-parallel ranks were started with different settings" in log, log[-3000:]
        assert "--max-running-requests: 16 on rank 0, 8 on rank 1" in log, log[-3000:]
        assert "--disable-fast-path: none on rank 0, triton_norm on rank 1" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def test_nodes_started_with_another_tp_size_stop_at_the_rendezvous(start_server, model_dir, engine_args):
    """Node 1 started with --tp 4, node 0 with --tp 2: torch's rendezvous waited its ten minutes on
    both; each now stops at once, saying what differs."""
    addr = _rendezvous_addr()
    common = ["--model", str(model_dir), "--nnodes", "2", "--dist-init-addr", addr, *engine_args]
    node1 = start_server([*common, "--tp", "4", "--node-rank", "1"], wait=False)
    node0 = start_server([*common, "--tp", "2", "--node-rank", "0"], wait=False)
    assert node0.wait_exit(60) != 0
    assert node1.wait_exit(30) != 0
    message = "node 1 was started with --tp 4 --nnodes 2, node 0 with --tp 2 --nnodes 2"
    for log in (node0.log(), node1.log()):
        assert message in log and "Traceback" not in log, log[-3000:]
