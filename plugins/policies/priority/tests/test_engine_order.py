"""priority in the real engine (the offline LLM on a tiny random model): with one request slot,
requests given at once finish in (priority, arrival) order, where prefill-first finishes them in
arrival order, and each generates exactly the tokens it generates alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minisgl_core import LLM, SamplingParams
from minisgl_core.cli import main
from minisgl_core.testing import cpu_llm, make_model_dir

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
PROMPTS = [[11 + i, 40 + 3 * i, 7, 90 + i, 23, 5 + i] for i in range(5)]
PRIORITIES = [3, 0, -2, 0, -7]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(
        tmp_path_factory.mktemp("priority") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256
    )


def finish_order(llm: LLM, priority: list[int] | None) -> tuple[list[int], list[list[int]]]:
    """The prompts' indices in the order their requests finished, and each one's tokens."""
    finished: list[int] = []
    step = llm.engine.step

    def recording():
        outputs = step()
        finished.extend(o.rid for o in outputs if o.finished)
        return outputs

    llm.engine.step = recording  # type: ignore[method-assign]
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, priority=priority)
    finally:
        del llm.engine.step
    first = min(finished)  # (one rid a prompt, given in prompt order)
    return [rid - first for rid in finished], [o.token_ids for o in outputs]


def test_requests_finish_by_priority_with_the_tokens_they_have_alone(model_dir: Path) -> None:
    with cpu_llm(model_dir, policy="prefill-first", max_running_requests=1) as llm:
        fcfs_order, fcfs_tokens = finish_order(llm, None)
        alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in PROMPTS]
    with cpu_llm(model_dir, policy="priority", max_running_requests=1) as llm:
        order, tokens = finish_order(llm, PRIORITIES)
    assert fcfs_order == [0, 1, 2, 3, 4]
    assert order == [4, 2, 1, 3, 0]  # (priority, arrival): -7, -2, 0 (earlier), 0, 3
    assert tokens == fcfs_tokens == alone
    assert len({t for out in tokens for t in out}) > 5, "degenerate outputs would make the check weak"


def test_a_priority_needs_the_priority_policy(model_dir: Path) -> None:
    with cpu_llm(model_dir) as llm:  # prefill-first, the default
        with pytest.raises(
            ValueError, match=r"^priority\[1\]: a priority other than 0 needs .*policy='priority'"
        ):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, priority=[0, 1])
        for bad in (True, 2**63, "high", 1.5):
            with pytest.raises(ValueError, match=r"^priority must be an integer in \[-2\*\*63, 2\*\*63-1\]"):
                llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, priority=[bad])
        with pytest.raises(ValueError, match="got 2 prompts but 1 priorities"):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, priority=[0])
        # all 0: what every policy does anyway
        assert len(llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False, priority=[0, 0])) == 2


def test_selectable_from_the_command_line(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--model", str(model_dir), "--policy", "priority", "--device", "cpu", "--attn", "torch",
            "--max-tokens", "3", "hello", "hello there"]  # fmt: skip
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [len(line["token_ids"]) for line in lines] == [3, 3]


def test_decode_out_of_kv_retracts_the_least_urgent_request(model_dir, caplog):
    """Three requests start together and outgrow a small pool: the core retracted the newest
    (here the most urgent, -5); it now retracts the least urgent (5, the oldest), vLLM's
    preemption order, and each still generates what it generates alone."""
    import logging
    import random

    rng = random.Random(3)
    prompts = [[rng.randrange(5, 1000) for _ in range(30)] for _ in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    with cpu_llm(model_dir, cache="naive") as alone:
        expected = [alone.generate([p], params, use_tqdm=False)[0].token_ids for p in prompts]
    with cpu_llm(model_dir, policy="priority", num_kv_tokens=256, page_size=1) as llm:
        priority_of: dict[int, int] = {}
        add = llm.engine.add_request

        def recording(rid, ids, sampling, *, priority=0, **kw):
            priority_of[rid] = priority
            return add(rid, ids, sampling, priority=priority, **kw)

        llm.engine.add_request = recording  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO, logger="minisgl_core.scheduler.scheduler"):
            outs = llm.generate(prompts, params, use_tqdm=False, priority=[5, 0, -5])
        assert llm.engine.stats()["retractions"] >= 1
    retracted = [
        int(r.getMessage().split()[5]) for r in caplog.records if "retracted request" in r.getMessage()
    ]
    assert retracted and priority_of[retracted[0]] == 5, (retracted, priority_of)
    assert [o.token_ids for o in outs] == expected
