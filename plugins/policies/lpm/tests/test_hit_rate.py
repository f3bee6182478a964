"""lpm in the real engine: on a shared-prefix workload whose pool is too small to keep every prefix
cached, it reuses more prompt tokens than prefill-first and generates exactly the same tokens."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from minisgl_core import LLM, SamplingParams
from minisgl_core.cli import main
from minisgl_core.testing import make_model_dir

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(
        tmp_path_factory.mktemp("lpm") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256
    )


def shared_prefix_prompts(groups: int = 4, per_group: int = 6, prefix_len: int = 48) -> list[list[int]]:
    """Requests of ``groups`` prompt families, arriving interleaved (a0 b0 c0 d0 a1 b1 ...), the
    order in which first-come-first-served evicts each family's prefix just before it is needed."""
    rng = random.Random(0)
    prefixes = [[rng.randrange(5, 1000) for _ in range(prefix_len)] for _ in range(groups)]
    return [
        prefixes[g] + [rng.randrange(5, 1000) for _ in range(8)]
        for _ in range(per_group)
        for g in range(groups)
    ]


def run(model_dir: Path, policy: str, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    # Two request rows; 160 KV tokens hold the running requests and about two families' prefixes,
    # not all four, so the order decides which prefixes are still cached when they are needed.
    llm = LLM(
        model_dir,
        device="cpu",
        dtype="float32",
        attn="torch",
        cache="radix",
        policy=policy,
        max_running_requests=2,
        num_kv_tokens=160,
    )
    outputs = [out.token_ids for out in llm.generate(prompts, GREEDY, use_tqdm=False)]
    stats = llm.engine.stats()
    return outputs, stats["cached_prompt_tokens"] / stats["prompt_tokens"]


def test_lpm_reuses_more_prefixes_with_the_same_outputs(model_dir: Path) -> None:
    prompts = shared_prefix_prompts()
    fcfs_outputs, fcfs_hit_rate = run(model_dir, "prefill-first", prompts)
    lpm_outputs, lpm_hit_rate = run(model_dir, "lpm", prompts)
    assert lpm_outputs == fcfs_outputs
    assert len({t for out in lpm_outputs for t in out}) > 10, (
        "degenerate outputs would make the comparison weak"
    )
    # Whole prefixes are 48 of 56 prompt tokens; lpm reuses most of them, FCFS loses them to eviction.
    assert lpm_hit_rate > 0.6, f"lpm hit rate {lpm_hit_rate:.2f}"
    assert lpm_hit_rate > fcfs_hit_rate + 0.2, f"lpm {lpm_hit_rate:.2f} vs prefill-first {fcfs_hit_rate:.2f}"


def test_selectable_from_the_command_line(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "generate",
        "--model",
        str(model_dir),
        "--policy",
        "lpm",
        "--device",
        "cpu",
        "--attn",
        "torch",
        "--max-tokens",
        "3",
        "hello",
        "hello there",
    ]
    assert main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [len(line["token_ids"]) for line in lines] == [3, 3]
