"""Loading a minisgl model from a model directory, and the ``transformers`` reference it is
checked against (same weights, full recomputation each step, no KV cache to share bugs with)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from minisgl_core.api import AttentionBackend, Model, ModelConfig, ParallelContext
from minisgl_core.checkpoint.formats import iter_checkpoint, load_hf_config
from minisgl_core.testing.harness import PagedSequences, greedy_generate, make_attention


def load_model(
    model_cls: type[Model],
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    parallel: ParallelContext | None = None,
    hf_config: dict[str, Any] | None = None,
) -> tuple[Model, set[str]]:
    """Build ``model_cls`` from ``model_dir`` and load its checkpoint; returns the model and the
    checkpoint names it used. ``hf_config`` replaces the directory's config.json when given."""
    config = ModelConfig(
        hf_config=hf_config if hf_config is not None else load_hf_config(model_dir),
        dtype=dtype,
        device=torch.device(device),
        parallel=parallel or ParallelContext(),
    )
    model = model_cls(config)
    used = model.load_weights(iter_checkpoint(model_dir, device=device))
    return model.eval(), used


def checkpoint_names(model_dir: str | Path) -> set[str]:
    return {name for name, _ in iter_checkpoint(model_dir)}


class TransformersReference:
    """The ``transformers`` model of a directory in float32 with eager attention."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()

    @torch.inference_mode()
    def last_logits(self, tokens: list[int]) -> torch.Tensor:
        """[vocab] float32 logits after ``tokens``."""
        return self.model(input_ids=torch.tensor([tokens])).logits[0, -1].float()

    def greedy(self, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
        """Same contract as :func:`minisgl_core.testing.harness.greedy_generate`."""
        tokens: list[int] = []
        logits: list[torch.Tensor] = []
        for _ in range(steps + 1):
            logits.append(self.last_logits(prompt + tokens))
            tokens.append(int(logits[-1].argmax()))
        return tokens, logits


def assert_logits_close(
    actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-4, what: str = "logits"
) -> None:
    """``actual`` within ``rel`` times the logit scale (largest |expected|, at least 1) of ``expected``."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = max(1.0, float(expected.abs().max()))
    error = float((actual.float() - expected.float()).abs().max())
    assert error <= rel * scale, f"{what}: max abs error {error:.3g} > {rel:g} x logit scale {scale:.3g}"


def random_prompt(length: int, vocab_size: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(vocab_size, (length,), generator=generator).tolist()


def check_greedy_against_transformers(
    model_cls: type[Model],
    model_dir: str | Path,
    backend_cls: type[AttentionBackend],
    *,
    prompt_len: int = 20,
    steps: int = 8,
    page_size: int = 1,
    hf_config: dict[str, Any] | None = None,
    rel: float = 1e-4,
) -> list[int]:
    """Prefill a random prompt and decode ``steps`` greedy tokens as one sequence; every step's
    logits must match transformers' and the greedy tokens must be equal. Also checks that the
    model used every checkpoint tensor. Returns the greedy tokens."""
    model, used = load_model(model_cls, model_dir, hf_config=hf_config)
    assert used == checkpoint_names(model_dir), (
        f"unused checkpoint tensors: {checkpoint_names(model_dir) - used}"
    )
    vocab_size = load_hf_config(model_dir)["vocab_size"]
    prompt = random_prompt(prompt_len, vocab_size)
    attn = make_attention(backend_cls, model.kv_spec, page_size=page_size)
    tokens, logits = greedy_generate(model, attn, prompt, steps)
    expected_tokens, expected_logits = TransformersReference(model_dir).greedy(prompt, steps)
    for step, (actual, expected) in enumerate(zip(logits, expected_logits, strict=True)):
        assert_logits_close(actual, expected, rel, what=f"logits of step {step} (0 = prefill)")
        assert tokens[step] == expected_tokens[step], (
            f"greedy token {step}: {tokens[step]} != {expected_tokens[step]}"
        )
    return tokens


def check_batch_against_transformers(
    model_cls: type[Model],
    model_dir: str | Path,
    backend_cls: type[AttentionBackend],
    *,
    prompt_lens: tuple[int, ...] = (5, 17, 11),
    decode_steps: int = 2,
    page_size: int = 1,
    rel: float = 1e-4,
) -> None:
    """Several sequences of different lengths in one prefill, then batched decode steps; each
    sequence's logits must match transformers run on that sequence alone."""
    model, _ = load_model(model_cls, model_dir)
    vocab_size = load_hf_config(model_dir)["vocab_size"]
    reference = TransformersReference(model_dir)
    prompts = [random_prompt(n, vocab_size, seed=i + 1) for i, n in enumerate(prompt_lens)]
    sequences = PagedSequences(make_attention(backend_cls, model.kv_spec, page_size=page_size), seed=1)
    rows = [sequences.new_row() for _ in prompts]
    new_tokens = prompts
    with torch.inference_mode():
        for step in range(decode_steps + 1):
            logits = model(sequences.extend(rows, new_tokens, is_prefill=step == 0))
            assert logits.shape == (len(prompts), vocab_size) and logits.dtype == torch.float32
            for i, prompt in enumerate(prompts):
                expected = reference.last_logits(prompt)
                assert_logits_close(logits[i], expected, rel, what=f"sequence {i} at step {step}")
                prompt.append(int(expected.argmax()))
            new_tokens = [[prompt[-1]] for prompt in prompts]


def _greedy_rank(
    rank: int,
    world: int,
    port: int,
    model_cls: type[Model],
    backend_cls: type[AttentionBackend],
    model_dir: str,
    out: str,
    prompt_len: int,
    steps: int,
) -> None:
    """One rank of :func:`greedy_on_ranks` (a spawned process)."""
    import torch.distributed as dist

    from minisgl_core.distributed import join_parent_store, leave_parent_store_group

    join_parent_store("gloo", rank, world, port)
    try:
        model, _ = load_model(model_cls, model_dir, parallel=ParallelContext(rank, world, dist.group.WORLD))
        prompt = random_prompt(prompt_len, load_hf_config(model_dir)["vocab_size"])
        with torch.inference_mode():
            tokens, logits = greedy_generate(
                model, make_attention(backend_cls, model.kv_spec, page_size=2), prompt, steps
            )
        torch.save((prompt, tokens, logits), f"{out}/rank{rank}.pt")
        del model
    finally:
        leave_parent_store_group()


def greedy_on_ranks(
    model_cls: type[Model],
    backend_cls: type[AttentionBackend],
    model_dir: str | Path,
    out: str | Path,
    *,
    prompt_len: int,
    steps: int,
    world: int = 2,
) -> list[tuple[list[int], list[int], list[torch.Tensor]]]:
    """``model_cls`` split over ``world`` gloo ranks (spawned processes, page size 2), each running
    :func:`greedy_generate` over a random prompt of ``prompt_len`` tokens for ``steps`` steps:
    each rank's (prompt, tokens, logits), through files in ``out``."""
    import torch.multiprocessing as mp

    from minisgl_core.distributed import parent_store

    store = parent_store(world)  # kept until every rank is done
    args = (world, store.port, model_cls, backend_cls, str(model_dir), str(out), prompt_len, steps)
    mp.spawn(_greedy_rank, args=args, nprocs=world, join=True)
    return [torch.load(Path(out) / f"rank{rank}.pt") for rank in range(world)]
