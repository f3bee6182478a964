"""How far ``--quantization`` / ``--kv-cache-dtype`` move the real default model from itself.

Greedy decoding of the real-model prompts (:data:`minisgl_core.testing.real_model.PROMPTS`) with
and without quantization, same engine (CPU and the ``torch`` backend by default; on a GPU its own
kernels and dtype with ``--device cuda``): *agreement* is the share of the unquantized run's
output tokens that the quantized run reproduces before it first picks another token (a prompt
counts its tokens up to the divergence, none after); the *logprob distance* is
``|logprob_quantized - logprob_unquantized|`` of the chosen token at every position where both
chose the same token from the same context. That mean is taken over each prompt's agreed prefix,
so it moves with where a run first forks (a change in the unquantized run's arithmetic moves it
too); the *teacher-forced distance* does not: both models are fed the prompt and the unquantized
run's whole output, and ``|Δlogprob|`` of every output token is averaged (``prompt_logprobs``, one
prefill each).

    python -m minisgl_core.testing.quant_accuracy      # the table in BENCHMARKS.md
    python -m minisgl_core.testing.quant_accuracy --variant fp8 --variant fp8-head
    python -m minisgl_core.testing.quant_accuracy --device cuda --attn auto --variant fp8   # GPU kernels, bf16
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

#: (label, quantization, kv_cache_dtype) compared against the unquantized run
VARIANTS: list[tuple[str, str | None, str]] = [
    ("int8", "int8", "auto"),
    ("int4", "int4", "auto"),
    ("int4-head", "int4-head", "auto"),
    ("fp8", "fp8", "auto"),
    ("fp8-head", "fp8-head", "auto"),
    ("fp8 KV", None, "fp8_e4m3"),
    ("fp8 + fp8 KV", "fp8", "fp8_e4m3"),
]


@dataclass(frozen=True)
class Run:
    """One greedy run: per prompt, the output tokens, their logprobs and the output text."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    texts: list[str]
    #: per prompt, the logprob of each forced output token (this run's own, or the tokens passed as
    #: ``forced``), the prompt and the tokens before it given as a prompt
    forced_logprobs: list[list[float]]


@dataclass(frozen=True)
class Agreement:
    label: str
    #: output tokens of the unquantized run
    reference_tokens: int
    #: of those, reproduced before the first divergence (summed over prompts)
    agreed_tokens: int
    #: prompts whose whole output is identical
    identical_prompts: int
    prompts: int
    mean_logprob_distance: float
    max_logprob_distance: float
    #: mean |Δlogprob| of the unquantized run's output tokens, both models teacher-forced
    forced_logprob_distance: float

    @property
    def agreement(self) -> float:
        return self.agreed_tokens / self.reference_tokens

    def row(self) -> str:
        return (
            f"| {self.label} | {self.agreement:.1%} ({self.agreed_tokens}/{self.reference_tokens}) | "
            f"{self.identical_prompts}/{self.prompts} | {self.mean_logprob_distance:.4f} | "
            f"{self.max_logprob_distance:.4f} | {self.forced_logprob_distance:.4f} |"
        )


def greedy_run(
    model_dir: Path,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    forced: list[list[int]] | None = None,
    *,
    device: str = "cpu",
    attn: str = "torch",
    dtype: str = "auto",
) -> Run:
    """Greedy outputs of the real-model prompts, then each prompt's output tokens teacher-forced:
    this run's own, or ``forced`` (one list per prompt). ``device``, ``attn`` and ``dtype`` place
    the engine (``dtype`` "auto": float32 on the CPU, bfloat16 on a GPU)."""
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing.real_model import MAX_TOKENS, PROMPTS
    from minisgl_core.tokenizer.load import apply_chat_template

    llm = LLM(
        str(model_dir),
        device=device,
        attn=attn,
        dtype=dtype,
        num_kv_tokens=8192,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
    )
    try:
        prompts = [apply_chat_template(llm.tokenizer, messages) for _, messages in PROMPTS]
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0))
        forced = [out.token_ids for out in outputs] if forced is None else forced
        scored = llm.generate(
            [prompt + tokens for prompt, tokens in zip(prompts, forced, strict=True)],
            SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
        )
    finally:
        llm.close()
    return Run(
        tokens=[out.token_ids for out in outputs],
        logprobs=[[lp.logprob for lp in out.logprobs or []] for out in outputs],
        texts=[out.text for out in outputs],
        forced_logprobs=[
            [entry.logprob for entry in out.prompt_logprobs[len(out.prompt_logprobs) - len(tokens) :]]
            for out, tokens in zip(scored, forced, strict=True)
        ],
    )


def compare(label: str, reference: Run, run: Run) -> Agreement:
    agreed = identical = 0
    distances: list[float] = []
    for ref_tokens, ref_lps, tokens, lps in zip(
        reference.tokens, reference.logprobs, run.tokens, run.logprobs, strict=True
    ):
        same = 0
        for a, b in zip(ref_tokens, tokens):
            if a != b:
                break
            same += 1
        agreed += same
        identical += ref_tokens == tokens
        distances += [abs(x - y) for x, y in zip(ref_lps[:same], lps[:same])]
    forced = [
        abs(x - y)
        for ref_lps, lps in zip(reference.forced_logprobs, run.forced_logprobs, strict=True)
        for x, y in zip(ref_lps, lps, strict=True)
    ]
    return Agreement(
        label=label,
        reference_tokens=sum(len(t) for t in reference.tokens),
        agreed_tokens=agreed,
        identical_prompts=identical,
        prompts=len(reference.tokens),
        mean_logprob_distance=sum(distances) / max(len(distances), 1),
        max_logprob_distance=max(distances, default=0.0),
        forced_logprob_distance=sum(forced) / max(len(forced), 1),
    )


def measure(
    model_dir: Path, variants=VARIANTS, reference: Run | None = None, **engine: str
) -> list[Agreement]:
    """Each variant against ``reference``, the unquantized :func:`greedy_run` (run here when None);
    ``engine``: :func:`greedy_run`'s ``device``, ``attn`` and ``dtype``, for every run."""
    reference = greedy_run(model_dir, **engine) if reference is None else reference
    return [
        compare(label, reference, greedy_run(model_dir, q, kv, reference.tokens, **engine))
        for label, q, kv in variants
    ]


def main() -> None:
    from minisgl_core.checkpoint.resolve import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the real default model")
    labels = [label for label, _, _ in VARIANTS]
    parser.add_argument(
        "--variant", action="append", choices=labels, help="measure only these (repeatable; default: all)"
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: the GPU's own kernels")
    parser.add_argument(
        "--attn", default="torch", help="attention backend (default torch; with --device cuda, e.g. auto)"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (default: float32 on the CPU, bfloat16 on a GPU)"
    )
    args = parser.parse_args()
    model_dir = Path(resolve_model(args.model))
    variants = [v for v in VARIANTS if args.variant is None or v[0] in args.variant]
    print(
        "| variant | greedy agreement | identical prompts | mean |Δlogprob| | max |Δlogprob| "
        "| teacher-forced mean |Δlogprob| |"
    )
    print("|---|---|---|---|---|---|")
    for result in measure(model_dir, variants, device=args.device, attn=args.attn, dtype=args.dtype):
        print(result.row(), flush=True)


if __name__ == "__main__":
    main()
