"""Mixed steps split between two backends (``MINISGL_SPLIT_MIXED=1``): with ``--attn torch,triton``
and mixed steps on, a mixed step's decode rows attend on this (the Triton decode) backend and its
prompt rows on the torch backend. Each request must get the greedy tokens it gets with the split
off (the torch backend attending every row of a mixed step), logprobs within float rounding,
and the split must really have run; with prompts sharing system prompts, the decode rows of a
mixed step are grouped for cascade (this backend's prefix kernel) as a decode step's are. In a
child process: on the CPU under Triton's interpreter; on a GPU in float32 with the compiled
kernels, where the fused rope + KV store, piecewise CUDA graphs and ``attend`` (pre-stored KV)
run too (``tools/device_suites.sh triton``).

Under the interpreter (minutes of CI) the model's RMS norm and SiLU kernels, which no mixed step
splits and ``tests/test_triton_ops.py`` checks, run eagerly; the shared-prompt case keeps the fused
rope + KV store, so its decode rows go through ``attend`` (pre-stored KV), and the plain case turns
it off, so its decode rows go through ``forward`` (each backend stores its rows' KV): each path
of the split once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile

import pytest
import torch

from minisgl_core.testing.triton_interpreter import run_under_interpreter

pytest.importorskip("triton")


#: the kernels the interpreter leaves to PyTorch: none a mixed step splits (see the docstring)
INTERPRETER_ENV = {"MINISGL_TRITON_NORM": "0", "MINISGL_TRITON_SILU": "0"}


def split_path(prompts: str) -> str:
    """How a split mixed step attends: ``attend`` after the fused rope + KV store, ``forward``
    (each backend storing its rows' KV) where the interpreter's plain case turns the store off."""
    return "forward" if prompts == "plain" and not torch.cuda.is_available() else "attend"


def run_child(page_size: int, prompts: str) -> dict:
    """The split off ("0") and on ("1"), one after the other in one child process."""
    if not torch.cuda.is_available():
        env = {**INTERPRETER_ENV, "MINISGL_FUSED_KV": "0" if split_path(prompts) == "forward" else "1"}
        out = run_under_interpreter(__file__, str(page_size), prompts, "cpu", env=env)
    else:
        proc = subprocess.run(
            [sys.executable, __file__, str(page_size), prompts, "cuda"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out = proc.stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize(("page_size", "prompts"), [(1, "plain"), (4, "shared")])
def test_split_mixed_steps_give_the_unsplit_tokens(page_size, prompts):
    runs = run_child(page_size, prompts)
    off, on = runs["0"], runs["1"]
    assert off["split_steps"] == 0 and on["split_steps"] >= 3, (off["split_steps"], on["split_steps"])
    if prompts == "shared":  # the decode rows of some mixed steps ran cascade
        assert on["cascade_split_steps"] >= 1, on["cascade_split_steps"]
    assert on["paths"] == [split_path(prompts)], on["paths"]
    assert on["mixed_steps"] == off["mixed_steps"] >= 3
    assert on["tokens"] == off["tokens"]
    assert len({t for ids in off["tokens"] for t in ids}) > 20  # a degenerate model would prove nothing
    worst = max(
        abs(a - b)
        for x, y in zip(on["logprobs"], off["logprobs"], strict=True)
        for a, b in zip(x, y, strict=True)
    )
    assert worst < 1e-4, worst


def child(page_size: str, prompts: str, device: str) -> None:
    runs = {}
    for split in ("0", "1"):  # read when the model runner is built
        os.environ["MINISGL_SPLIT_MIXED"] = split
        runs[split] = one_run(page_size, prompts, device)
    print(json.dumps(runs))


def one_run(page_size: str, prompts: str, device: str) -> dict:
    from minisgl_core.demo.factories import make_model_dir
    from minisgl_core.llm import LLM
    from minisgl_core.runner.split_mixed import SplitMixedAttention
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.scheduler import cascade
    from minisgl_core.testing import cpu_llm, run_staggered

    cascade.MIN_SAVED_TOKENS, cascade.MIN_SAVED_SHARE = 0, 0.0  # cascade for any saving
    rng = random.Random(0)
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    # short prompts decoding while longer ones (chunked by the budget) arrive
    plan = [(0, 9), (0, 17), (2, 70), (3, 5), (5, 90), (8, 30)]
    arrivals = [(at, [rng.randrange(5, 500) for _ in range(n)], greedy) for at, n in plan]
    if prompts == "shared":  # two system prompts, three requests behind each, then two long ones
        system = [[rng.randrange(5, 500) for _ in range(24)] for _ in range(2)]
        arrivals = [
            (at, system[i % 2] + [rng.randrange(5, 500) for _ in range(3 + i)], greedy)
            for i, at in enumerate((0, 0, 2, 2, 4, 4))
        ] + arrivals[4:]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model_dir(
            tmp,
            "Qwen3ForCausalLM",
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            hidden_size=128,
        )
        options = dict(
            attn="torch,triton", mixed_batch=True, page_size=int(page_size), max_prefill_tokens=40,
            num_kv_tokens=1024,
        )  # fmt: skip
        if device == "cpu":
            llm = cpu_llm(model, **options)
        else:  # float32 on the GPU too: the two runs' kernels must agree to float rounding
            llm = LLM(str(model), device="cuda", dtype="float32", **options)
        split = llm.engine.runner.split_mixed
        steps = {"split_steps": 0, "cascade_split_steps": 0}
        paths: set[str] = set()  # which of the split's forward / attend the model called
        if split is not None:
            prepare = SplitMixedAttention.prepare_metadata

            def counting(self, batch, prepare=prepare):
                steps["split_steps"] += 1
                steps["cascade_split_steps"] += bool(batch.shared_prefixes)
                return prepare(self, batch)

            SplitMixedAttention.prepare_metadata = counting
            for name in ("forward", "attend"):
                setattr(SplitMixedAttention, name, noting(name, getattr(SplitMixedAttention, name), paths))
        run = run_staggered(llm, arrivals)
        llm.close()
    return {
        **steps,
        "paths": sorted(paths),
        "mixed_steps": run.kinds.count("mixed"),
        "tokens": [run.tokens[i] for i in range(len(arrivals))],
        "logprobs": [run.logprobs[i] for i in range(len(arrivals))],
    }


def noting(name: str, method, paths: set[str]):
    """``method``, adding ``name`` to ``paths`` when called."""

    def call(self, *args, **kwargs):
        paths.add(name)
        return method(self, *args, **kwargs)

    return call


if __name__ == "__main__":
    child(*sys.argv[1:])
