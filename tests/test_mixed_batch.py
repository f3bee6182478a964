"""Mixed steps: chunked prefill rides along with the running decodes.

With mixed batching on (the default where the prefill backend declares "mixed"), a prefill step
also carries one token of every running decode, so a long prompt being prefilled in chunks no
longer stalls the requests already decoding. The tokens must be the ones each request gets alone.
Requests arrive while others decode (the engine is stepped by hand), so mixed steps really happen.
"""

from __future__ import annotations

import random
import re

import pytest

from minisgl_core import SamplingParams
from minisgl_core.api import GrammarSpec
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import assert_kv_released, cpu_llm, drain, run_staggered


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM", max_position_embeddings=512
    )


def alone(model_dir, arrivals, **kw) -> list[list[int]]:
    """Each request on its own: no batching, no cache, no chunking."""
    llm = cpu_llm(model_dir, cache="naive", **kw)
    out = [llm.generate([p], params, use_tqdm=False)[0].token_ids for _, p, params in arrivals]
    llm.close()
    return out


def workload(seed: int, max_tokens: int = 24) -> list[tuple[int, list[int], SamplingParams]]:
    """Short prompts decoding while long ones (chunked by a small budget) arrive, and more
    short ones arriving while the long ones are being prefilled."""
    rng = random.Random(seed)
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(5, 1000) for _ in range(n)]

    plan = [(0, 7), (0, 19), (1, 3), (4, 230), (5, 11), (6, 2), (9, 160), (10, 40), (12, 9), (30, 120)]
    return [(at, prompt(n), greedy) for at, n in plan]


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("qwen", dict(cache="radix", max_prefill_tokens=48)),
        ("qwen", dict(cache="naive", max_prefill_tokens=33, page_size=4)),
        ("qwen", dict(cache="radix", max_prefill_tokens=64, page_size=16, overlap=False)),
        ("llama", dict(cache="radix", max_prefill_tokens=40, page_size=4)),
    ],
    ids=["qwen-radix", "qwen-naive-page4", "qwen-page16-no-overlap", "llama-page4"],
)
def test_mixed_on_and_off_give_each_request_its_own_tokens(request, model, options):
    model_dir = request.getfixturevalue(f"{model}_dir")
    arrivals = workload(seed=1)
    expected = alone(model_dir, arrivals)
    assert len({t for ids in expected for t in ids}) > 40  # a degenerate model would prove nothing
    runs = {}
    for mixed in (True, False):
        llm = cpu_llm(model_dir, mixed_batch=mixed, **options)
        assert llm.engine.scheduler.mixed is mixed
        run = runs[mixed] = run_staggered(llm, arrivals)
        assert [run.tokens[i] for i in range(len(arrivals))] == expected, f"mixed_batch={mixed}"
        assert all(run.finish[i] == "length" for i in range(len(arrivals)))
        # a step never exceeds the budget: decode rows count against max_prefill_tokens
        assert all(
            tokens <= options["max_prefill_tokens"] for tokens, decodes in run.sizes if decodes < tokens
        )
        assert_kv_released(llm)
        llm.engine.scheduler.kv.cache.check_integrity()
        llm.close()
    assert runs[True].count("mixed") >= 5
    assert runs[False].count("mixed") == 0
    # every decode row is still run once per token: one per output token past the first
    decode_rows = sum(d for _, d in runs[True].sizes)
    assert decode_rows == sum(len(t) - 1 for t in expected)
    # riding along, the decodes no longer wait while prompts are prefilled
    assert runs[True].longest_wait() == 1
    assert runs[False].longest_wait() > 1


@pytest.mark.parametrize("overlap", [True, False])
def test_a_decode_gets_a_token_every_step_while_a_long_prompt_prefills(qwen_dir, overlap):
    short = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    long_prompt = list(range(10, 210))  # 200 tokens: 13 chunks of at most 16
    stalls = {}
    for mixed in (True, False):
        llm = cpu_llm(qwen_dir, cache="naive", max_prefill_tokens=16, overlap=overlap, mixed_batch=mixed)
        engine = llm.engine
        engine.add_request(0, [5, 6, 7], short)
        while not any(o.rid == 0 for o in engine.step()):
            pass  # until request 0 decodes
        engine.add_request(1, long_prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        stalled = steps = 0
        first_token_of_1 = False
        while not first_token_of_1:
            outputs = engine.step()
            steps += 1
            stalled += not any(o.rid == 0 for o in outputs)
            first_token_of_1 = any(o.rid == 1 for o in outputs)
            if engine.launched_last is not None and engine.launched_last.forward.is_prefill:
                assert sum(engine.launched_last.chunk_lens) <= 16
        assert steps >= 200 // 16
        stalls[mixed] = stalled
        drain(engine)
        llm.close()
    assert stalls[True] == 0
    assert stalls[False] >= 200 // 16 - 1  # the test can tell: without mixing, decode waits


def test_retraction_under_a_small_pool_with_mixed_steps(qwen_dir):
    """Decodes take their next slot before a mixed step's chunks: when the pool runs out the
    newest running request is retracted, and every request still gets its own tokens."""
    rng = random.Random(3)
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    arrivals = [(i * 3, [rng.randrange(5, 1000) for _ in range(30 + 7 * i)], params) for i in range(7)]
    expected = alone(qwen_dir, arrivals)
    for page_size in (1, 4):
        llm = cpu_llm(qwen_dir, cache="radix", num_kv_tokens=256, page_size=page_size, max_prefill_tokens=24)
        run = run_staggered(llm, arrivals)
        assert [run.tokens[i] for i in range(len(arrivals))] == expected
        stats = llm.engine.stats()
        assert stats["retractions"] >= 1
        assert run.count("mixed") >= 3
        assert_kv_released(llm)
        llm.engine.scheduler.kv.cache.check_integrity()
        llm.close()


GRAMMAR = "(ab|cd){1,4}e"


def test_penalties_logprobs_and_grammars_in_mixed_steps(qwen_dir):
    """Decode rows of mixed steps sample like decode steps: penalties (which read the newest
    outputs on the host), logprobs and grammar masks give what they give with mixing off."""
    rng = random.Random(5)
    base = dict(temperature=0.0, max_tokens=20, ignore_eos=True)
    kinds = [
        SamplingParams(**base, logprobs=2),
        SamplingParams(**base, frequency_penalty=0.8, presence_penalty=0.5),
        SamplingParams(**base, repetition_penalty=1.3),
        SamplingParams(temperature=0.0, max_tokens=40, grammar=GrammarSpec("regex", GRAMMAR)),
        SamplingParams(temperature=0.9, top_k=40, seed=11, max_tokens=20, ignore_eos=True),
    ]
    arrivals = []
    for i in range(10):
        n = 150 if i in (3, 7) else rng.randrange(3, 30)
        arrivals.append((2 * i, [rng.randrange(5, 1000) for _ in range(n)], kinds[i % len(kinds)]))
    runs = {}
    for mixed in (True, False):
        llm = cpu_llm(qwen_dir, cache="radix", max_prefill_tokens=32, mixed_batch=mixed)
        runs[mixed] = run_staggered(llm, arrivals)
        texts = {
            i: llm.tokenizer.decode(runs[mixed].tokens[i], skip_special_tokens=True)
            for i in range(len(arrivals))
        }
        llm.close()
        for i, (_, _, params) in enumerate(arrivals):
            if params.grammar is not None:
                assert runs[mixed].finish[i] == "stop"
                assert re.fullmatch(GRAMMAR, texts[i]), texts[i]
    on, off = runs[True], runs[False]
    assert on.count("mixed") >= 5
    assert on.tokens == off.tokens
    assert on.finish == off.finish
    for i, (_, _, params) in enumerate(arrivals):
        assert len(on.logprobs[i]) == (len(on.tokens[i]) if params.logprobs is not None else 0)
        assert on.logprobs[i] == pytest.approx(off.logprobs[i], abs=1e-4)


def test_off_switch_and_backends_without_the_capability(qwen_dir, monkeypatch):
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    assert "mixed" in TorchAttentionBackend.capabilities
    assert cpu_llm(qwen_dir, num_kv_tokens=1024).engine.scheduler.mixed
    assert not cpu_llm(qwen_dir, num_kv_tokens=1024, mixed_batch=False).engine.scheduler.mixed
    # a third-party prefill backend that does not declare "mixed" keeps prefill and decode apart
    monkeypatch.setattr(TorchAttentionBackend, "capabilities", TorchAttentionBackend.capabilities - {"mixed"})
    llm = cpu_llm(qwen_dir, num_kv_tokens=1024)
    assert not llm.engine.scheduler.mixed
    run = run_staggered(llm, workload(seed=2, max_tokens=6)[:5])
    assert run.count("mixed") == 0 and run.count("prefill") > 0


def test_cli_flag():
    import argparse

    from minisgl_core.config_args import add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert parser.parse_args(["--model", "x"]).disable_mixed_batch is False
    assert parser.parse_args(["--model", "x", "--disable-mixed-batch"]).disable_mixed_batch is True
    assert parser.parse_args(["--model", "x", "--enable-mixed-batch"]).enable_mixed_batch is True
    with pytest.raises(SystemExit):  # not both
        parser.parse_args(["--model", "x", "--enable-mixed-batch", "--disable-mixed-batch"])


def test_default_is_mixed_on_a_cpu(qwen_dir):
    """None (the default) means on for a CPU engine (off on CUDA, where it measured slower)."""
    from minisgl_core.config import EngineConfig
    from minisgl_core.config_args import add_engine_args, engine_config_from_args

    assert EngineConfig(model="m").mixed_batch is None
    llm = cpu_llm(qwen_dir)
    assert llm.engine.config.mixed_batch is None and llm.engine.scheduler.mixed
    llm.close()
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for flags, expected in (([], None), (["--enable-mixed-batch"], True), (["--disable-mixed-batch"], False)):
        args = parser.parse_args(["--model", str(qwen_dir), *flags])
        assert engine_config_from_args(args).mixed_batch is expected


def test_real_default_model_mixed_on_equals_off(default_model_dir):
    """SmolLM2-135M (real weights): staggered arrivals, long prompts chunked, greedy outputs
    identical with mixing on and off, and equal to each request run alone."""
    rng = random.Random(7)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    words = "the a cat dog runs over under quick brown lazy fox jumps river tree sky blue".split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    llm = cpu_llm(default_model_dir, num_kv_tokens=4096, max_prefill_tokens=48, mixed_batch=True)
    prompts = [llm.tokenizer.encode(text(n)) for n in (6, 120, 4, 10, 90, 3)]
    arrivals = [(at, p, params) for at, p in zip((0, 2, 3, 5, 7, 9), prompts, strict=True)]
    on = run_staggered(llm, arrivals)
    assert on.count("mixed") >= 3
    llm.close()
    expected = alone(default_model_dir, arrivals, num_kv_tokens=4096)
    off_llm = cpu_llm(default_model_dir, num_kv_tokens=4096, max_prefill_tokens=48, mixed_batch=False)
    off = run_staggered(off_llm, arrivals)
    off_llm.close()
    assert [on.tokens[i] for i in range(len(prompts))] == expected
    assert on.tokens == off.tokens


@pytest.mark.parametrize(
    "options", [dict(cache="radix"), dict(cache="naive", page_size=4, num_kv_tokens=320)]
)
def test_speculative_decoding_and_mixed_steps_together(llama_dir, options):
    """With speculative decoding on, decode steps may be verify steps (drafts), and prefill steps
    are still mixed: their decode rows run one token each, without drafts. Greedy tokens stay each
    request's own, both kinds of step happen, and the KV comes back."""
    rng = random.Random(9)
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    arrivals = []
    for i, (at, n) in enumerate([(0, 6), (0, 9), (2, 150), (4, 5), (8, 120), (9, 7), (20, 90)]):
        piece = [rng.randrange(5, 1000) for _ in range(n)]
        # copy-heavy prompts (a piece repeated) give the n-gram drafter something to propose
        arrivals.append((at, piece * 4 if i % 2 == 0 and n < 20 else piece, greedy))
    expected = alone(llama_dir, arrivals)
    llm = cpu_llm(llama_dir, max_prefill_tokens=40, speculative_algorithm="ngram", **options)
    assert llm.engine.scheduler.mixed and llm.engine.verify is not None
    run = run_staggered(llm, arrivals)
    assert [run.tokens[i] for i in range(len(arrivals))] == expected
    stats = llm.engine.stats()
    assert run.count("mixed") >= 5
    assert run.count("verify") == stats["spec_verify_steps"] >= 3 and stats["spec_accepted_tokens"] > 0
    # mixed steps after verify steps: a decode row's input is the last token a verify step accepted
    first_verify = run.kinds.index("verify")
    assert "mixed" in run.kinds[first_verify:]
    assert_kv_released(llm)
    if options["cache"] == "radix":
        llm.engine.scheduler.kv.cache.check_integrity()
    llm.close()
