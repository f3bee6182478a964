"""Running the offline engine in tests: a small engine on the CPU, requests added and stepped by
hand, and the KV accounting check once nothing runs.

The core's engine tests (batching, speculative decoding, mixed steps, quantization, weight
formats, tensor parallelism) use these instead of each keeping its own copies; a cache or policy
plugin can run end to end the same way on a tiny model (``make_model_dir``)::

    llm = cpu_llm(make_model_dir(tmp_path / "m", "Qwen3ForCausalLM"), cache="mycache")
    run = run_staggered(llm, [(0, [5, 6, 7], params), (3, [8, 9], params)])
    assert run.finish == {0: "length", 1: "length"}
    assert_kv_released(llm)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minisgl_core.engine.engine import Engine
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams, StepOutput
from minisgl_core.scheduler.speculative import VerifyBatch


def cpu_llm(model_dir: str | Path, **options: Any) -> LLM:
    """An offline :class:`~minisgl_core.LLM` of ``model_dir`` on the CPU in float32, with the
    ``torch`` attention backend unless ``attn`` is given; ``options`` are the LLM's own
    (``cache``, ``page_size``, ``num_kv_tokens``, ``mixed_batch``, ...)."""
    options.setdefault("attn", "torch")
    return LLM(model_dir, device="cpu", dtype="float32", **options)


def drain(engine: Engine) -> list[StepOutput]:
    """Step ``engine`` until it has no work left; every step's outputs, in order."""
    outputs: list[StepOutput] = []
    while engine.has_work:
        outputs += engine.step()
    return outputs


@dataclass
class StaggeredRun:
    """What :func:`run_staggered` saw, per request id (its index in the arrivals) and per step."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    #: the sampled tokens' logprobs, for requests that asked for them
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    #: per step: the kind of batch launched ("prefill", "decode", "mixed", "verify"; None:
    #: nothing) and the request ids that got a token
    kinds: list[str | None] = field(default_factory=list)
    got: list[set[int]] = field(default_factory=list)
    #: per launched step but verify steps: (new tokens in the step, decode rows in it)
    sizes: list[tuple[int, int]] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """Steps that launched a batch of this kind."""
        return sum(k == kind for k in self.kinds)

    def longest_wait(self) -> int:
        """The most steps any request waited between two of its tokens."""
        steps = {rid: [i for i, got in enumerate(self.got) if rid in got] for rid in self.tokens}
        return max(b - a for s in steps.values() for a, b in zip(s, s[1:]))


def run_staggered(
    llm: LLM, arrivals: Sequence[tuple[int, list[int], SamplingParams]], *, max_steps: int = 10_000
) -> StaggeredRun:
    """Add request ``i`` (``arrivals[i]`` = (step, prompt token ids, params)) when the engine is at
    that step, and step until every request is done. Requests arriving while others decode are
    what makes mixed steps, retraction and verify batches happen; ``LLM.generate`` adds all at once.
    Fails after ``max_steps`` steps (a request that never finishes)."""
    engine, run = llm.engine, StaggeredRun()
    step = 0
    while step <= max(at for at, _, _ in arrivals) or engine.has_work:
        for rid, (at, prompt, params) in enumerate(arrivals):
            if at == step:
                engine.add_request(rid, prompt, params)
                run.tokens[rid], run.logprobs[rid] = [], []
        outputs = engine.step()
        batch = engine.launched_last
        verify = isinstance(batch, VerifyBatch)  # speculative decoding's decode step with drafts
        run.kinds.append(None if batch is None else "verify" if verify else batch.kind)
        if batch is not None and not verify:
            decode_rows = len(batch.requests) if batch.kind == "decode" else batch.decodes
            run.sizes.append((sum(batch.chunk_lens), decode_rows))
        run.got.append({o.rid for o in outputs})
        for o in outputs:
            run.tokens[o.rid].append(o.token_id)
            if o.logprob is not None:
                run.logprobs[o.rid].append(o.logprob.logprob)
            if o.finished:
                run.finish[o.rid] = o.finish_reason
        step += 1
        assert step < max_steps, f"requests still running after {max_steps} steps"
    return run


def assert_kv_released(llm: LLM) -> None:
    """Once nothing runs, every KV page is either free or held by the prefix cache (evictable, not
    locked), no request is admitted, and no page was freed twice."""
    kv = llm.engine.scheduler.kv
    assert not llm.engine.has_work
    size = kv.cache.size_info()
    assert size.protected == 0
    assert not kv.admitted
    held = kv.allocator.num_pages - kv.allocator.free_pages
    assert held * kv.page_size == size.evictable
    assert len(set(kv.allocator._free)) == kv.allocator.free_pages  # no page freed twice
