"""``SamplingParams.prompt_logprobs`` (vLLM's): every prompt token's logprob given the tokens before
it, and the k most likely tokens there, against transformers in float32 on the same weights; the
same in one prefill step, in chunks, riding along with running decodes (mixed steps), after the
same prompt is already in the prefix cache, with overlap scheduling on and off."""

from __future__ import annotations

import pytest
import torch

from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import TransformersReference, random_prompt


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("plp") / "llama", "LlamaForCausalLM")


@pytest.fixture(scope="module")
def reference(model_dir):
    return TransformersReference(model_dir)


#: logprobs closer than this may rank either way between two float32 computations
TIE = 1e-4


def _expected(
    reference: TransformersReference, prompt: list[int], k: int
) -> list[tuple[float, list[int], range]]:
    """Per prompt token after the first, from transformers: its logprob, the top-k ids, and the
    ranks it may have (1 + the tokens surely more likely .. the tokens at least about as likely)."""
    with torch.inference_mode():
        logits = reference.model(input_ids=torch.tensor([prompt])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    out = []
    for p in range(len(prompt) - 1):
        row, target = logprobs[p], float(logprobs[p, prompt[p + 1]])
        ranks = range(int((row > target + TIE).sum()) + 1, int((row >= target - TIE).sum()) + 1)
        out.append((target, row.topk(k).indices.tolist() if k else [], ranks))
    return out


def _check(output, prompt: list[int], expected, k: int) -> None:
    got = output.prompt_logprobs
    assert got is not None and len(got) == len(prompt), (None if got is None else len(got), len(prompt))
    assert got[0] is None
    for p, (entry, (logprob, top_ids, ranks)) in enumerate(zip(got[1:], expected, strict=True)):
        assert entry.token_id == prompt[p + 1]
        assert abs(entry.logprob - logprob) < 1e-4, (p, entry.logprob, logprob)
        assert entry.rank in ranks, (p, entry.rank, ranks)
        assert len(entry.top) == k
        if k:
            assert [t for t, _ in entry.top] == top_ids, (p, entry.top, top_ids)
            values = [v for _, v in entry.top]
            assert values == sorted(values, reverse=True) and values[0] >= entry.logprob - 1e-6


@pytest.mark.parametrize(
    "overlap, max_prefill_tokens, rows_per_step",
    [(True, 8192, None), (True, 7, None), (False, 5, None), (True, 8192, 4)],
    ids=["one-step", "chunks-overlap", "chunks-no-overlap", "scored-rows-cap"],
)
def test_prompt_logprobs_match_transformers(
    model_dir, reference, overlap, max_prefill_tokens, rows_per_step, monkeypatch
):
    if rows_per_step is not None:  # a step scores at most this many prompt tokens: chunks are cut
        monkeypatch.setattr("minisgl_core.scheduler.scheduler.PROMPT_LOGPROBS_ROWS", rows_per_step)
    vocab = 1000  # ids inside the test model's vocabulary (2,048) and its tokenizer's
    prompts = [random_prompt(n, vocab, seed=n) for n in (1, 2, 9, 23)]
    llm = LLM(model_dir, device="cpu", dtype="float32", attn="torch", overlap=overlap,
              max_prefill_tokens=max_prefill_tokens)  # fmt: skip
    kinds: list[tuple[str, int]] = []  # (step kind, prompt rows) of the steps that scored prompts
    schedule = llm.engine.scheduler.schedule

    def spy():
        batch = schedule()
        if batch is not None and batch.prompt_rows:
            kinds.append((batch.kind, sum(count for _, _, count, _ in batch.prompt_rows)))
        return batch

    llm.engine.scheduler.schedule = spy
    try:
        # a request running while the others prefill (mixed steps on the CPU), one without
        # prompt_logprobs, and the same prompt twice (the second would reuse the cache)
        params = [SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=k) for k in (0, 3, 1, 5)]
        plain = SamplingParams(max_tokens=12, temperature=0.0)
        outputs = llm.generate(
            [prompts[3], *prompts, prompts[3]], [plain, *params, params[3]], use_tqdm=False
        )
        assert outputs[0].prompt_logprobs is None
        for output, prompt, p in zip(outputs[1:], [*prompts, prompts[3]], [*params, params[3]], strict=True):
            _check(output, prompt, _expected(reference, prompt, p.prompt_logprobs), p.prompt_logprobs)
        # every prompt position scored once (the repeated prompt twice), in one step or in chunks
        assert sum(n for _, n in kinds) == sum(len(q) - 1 for q in prompts) + len(prompts[3]) - 1
        if max_prefill_tokens < 23:
            assert len(kinds) > 2 and "mixed" in {kind for kind, _ in kinds}, kinds
        if rows_per_step is not None:
            assert max(n for _, n in kinds) <= rows_per_step and len(kinds) > 10, kinds
        # and the output tokens are the ones without prompt_logprobs
        again = llm.generate(prompts, [SamplingParams(max_tokens=4, temperature=0.0)] * 4, use_tqdm=False)
        assert [o.token_ids for o in again] == [o.token_ids for o in outputs[1:5]]
        # the prompt is in the prefix cache now: a plain request reuses it, one with
        # prompt_logprobs computes it whole
        kv = llm.engine.scheduler.kv
        cached = kv.cached_tokens
        llm.generate([prompts[3]], [SamplingParams(max_tokens=1)], use_tqdm=False)
        assert kv.cached_tokens > cached
        cached = kv.cached_tokens
        [output] = llm.generate([prompts[3]], [params[3]], use_tqdm=False)
        assert kv.cached_tokens == cached
        _check(output, prompts[3], _expected(reference, prompts[3], 5), 5)
    finally:
        llm.close()


def test_prompt_logprobs_range_is_checked():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
