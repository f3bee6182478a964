"""`minisgl bench cpu`: our offline ``LLM`` against ``transformers`` ``generate`` on the CPU.

Both run in this process on the same weights (transformers loads the same GGUF through its own
GGUF reader, or the same model directory), the same chat prompts, greedy, the same number of new
tokens for every request (ours ignores EOS; transformers is held to it with ``min_new_tokens``),
at each batch size, alternating run by run so that a machine shared with other jobs slows both
alike. Next to each figure: the memory-bandwidth bound, i.e. the bytes one decode step must read
(the weights once, plus the KV cache of every sequence) over the machine's read bandwidth,
measured here with a large-tensor reduction and copy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: chat prompts of a laptop user's kind (short questions, a multi-turn one, two languages, code)
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "user", "content": "My name is Ada and I like chess."},
        {"role": "assistant", "content": "Nice to meet you, Ada! Chess is a great game."},
        {"role": "user", "content": "What is my name, and which game do I like?"},
    ],
    [{"role": "user", "content": "Quelle est la couleur du ciel par beau temps ?"}],
    [{"role": "user", "content": "Write a Python function that returns the sum of two numbers."}],
    [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}],
    [
        {"role": "system", "content": "You are a pirate. Always talk like a pirate."},
        {"role": "user", "content": "Say hello to my friend."},
    ],
    [{"role": "user", "content": "Give me three tips for learning to cook."}],
    [{"role": "user", "content": "What is 12 plus 7?"}],
]


@dataclass(frozen=True)
class Bandwidth:
    #: GB/s (1e9 bytes) reading one large tensor (a sum over it)
    read: float
    #: GB/s counting the bytes read and the bytes written (``dst.copy_(src)``)
    copy: float


def memory_bandwidth(size_mib: int = 512, repeats: int = 7) -> Bandwidth:
    """Best of ``repeats`` over tensors far larger than the last-level cache, with the threads
    torch runs on now."""
    src = torch.ones(size_mib << 18, dtype=torch.float32)  # size_mib MiB of float32
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    read = copy = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        src.sum()
        read = max(read, nbytes / (time.perf_counter() - start))
        start = time.perf_counter()
        dst.copy_(src)
        copy = max(copy, 2 * nbytes / (time.perf_counter() - start))
    return Bandwidth(read=read / 1e9, copy=copy / 1e9)


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of the weights one forward reads: every distinct parameter and buffer once (a tied
    lm_head reads the embedding table in full), minus an untied input embedding table, of which
    a step reads only its tokens' rows."""
    seen: set[int] = set()
    total = 0
    tensors = [*model.parameters(), *model.buffers()]
    for tensor in tensors:
        key = tensor.untyped_storage().data_ptr() if tensor.numel() else id(tensor)
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    embed = _input_embedding(model)
    head = getattr(model, "lm_head", None)
    if embed is not None and (head is None or head.weight.data_ptr() != embed.data_ptr()):
        total -= embed.numel() * embed.element_size()
    return total


def _input_embedding(model: torch.nn.Module) -> torch.Tensor | None:
    for name, param in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            return param
    return None


def kv_bytes_per_token(runner: Any) -> int:
    """Bytes of K and V that one position of context holds over all layers: the runner's KV pool,
    in its own dtype (a float8 pool under ``--kv-cache-dtype fp8_e4m3`` holds a byte a value,
    whatever the weights' dtype)."""
    pool = runner.kv_cache
    return pool.bytes_per_token(pool.num_layers, pool.num_kv_heads, pool.head_dim, pool.dtype)


def bound_tok_per_s(
    bandwidth_gbs: float, weight_bytes: int, kv_per_token: int, prompt_lens: list[int], new_tokens: int
) -> float:
    """Output tokens per second if every decode step only read its bytes at ``bandwidth_gbs``:
    the weights once per step, and each sequence's KV at its mean length over the run."""
    mean_context = sum(prompt_lens) / len(prompt_lens) + new_tokens / 2
    step_bytes = weight_bytes + len(prompt_lens) * mean_context * kv_per_token
    return len(prompt_lens) * bandwidth_gbs * 1e9 / step_bytes


def chat_prompts(tokenizer: Any, batch_size: int) -> list[list[int]]:
    """:data:`CHATS` through the model's chat template, cycled to ``batch_size``."""
    from minisgl_core.tokenizer.load import apply_chat_template

    return [apply_chat_template(tokenizer, CHATS[i % len(CHATS)]) for i in range(batch_size)]


class OursRunner:
    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        from minisgl_core.sampling import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        return [o.token_ids for o in self.llm.generate(prompts, params, use_tqdm=False)]


class TransformersRunner:
    """``transformers`` float32 ``generate``, greedy, left-padded batches, sdpa attention (its
    default on CPU and its fastest there)."""

    def __init__(self, model_dir: str | Path, eos_ids: set[int]) -> None:
        from transformers import AutoModelForCausalLM

        path = Path(model_dir)
        ggufs = [path] if path.suffix == ".gguf" else sorted(path.glob("*.gguf"))
        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if ggufs and not (path.is_dir() and (path / "model.safetensors").exists()):
            kwargs["gguf_file"] = ggufs[0].name
            path = ggufs[0].parent
        self.model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
        self.eos = sorted(eos_ids)
        self.pad = self.eos[0] if self.eos else 0

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,  # EOS masked until then: every row as long as ours
                eos_token_id=self.eos or None,
                pad_token_id=self.pad,
            )
        return out[:, width:].tolist()


def _same_until_eos(ours: list[int], theirs: list[int], eos: set[int]) -> bool:
    """Whether the two greedy outputs agree up to the first EOS ours chose. After it they part by
    design: ours ignores EOS and goes on from it, transformers (held to the same length by
    ``min_new_tokens``) has EOS masked and goes on from its next best token."""
    end = next((i for i, token in enumerate(ours) if token in eos), len(ours))
    return ours[:end] == theirs[:end]


def run_cpu_bench(
    llm: Any,
    theirs: TransformersRunner | None,
    *,
    batch_sizes: list[int],
    new_tokens: int,
    rounds: int,
    bandwidth: Bandwidth,
) -> dict[str, Any]:
    """Alternate ours and theirs ``rounds`` times at each batch size (the first of the pair swaps
    each round); returns the figures, their medians and the bounds."""
    model = llm.engine.runner.model
    eos = set(llm.engine.eos_ids)
    weights = weight_bytes_per_step(model)
    kv_token = kv_bytes_per_token(llm.engine.runner)
    runners: dict[str, Any] = {"minisgl": OursRunner(llm)}
    if theirs is not None:
        runners["transformers"] = theirs
    warm = chat_prompts(llm.tokenizer, 2)
    for runner in runners.values():  # first-call costs (allocator, lazy imports) outside the timing
        runner.generate(warm[:1], 4)
        runner.generate(warm, 4)
    rows = []
    for bs in batch_sizes:
        prompts = chat_prompts(llm.tokenizer, bs)
        times: dict[str, list[float]] = {name: [] for name in runners}
        outputs: dict[str, list[list[int]]] = {}
        for r in range(rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(runners))
            for name in order:
                start = time.perf_counter()
                out = runners[name].generate(prompts, new_tokens)
                times[name].append(time.perf_counter() - start)
                if [len(o) for o in out] != [new_tokens] * bs:
                    raise RuntimeError(
                        f"{name} generated {[len(o) for o in out]} tokens, not {new_tokens} each"
                    )
                outputs[name] = out
        row: dict[str, Any] = {
            "batch_size": bs,
            "prompt_tokens": [len(p) for p in prompts],
            "bound_tok_per_s": round(
                bound_tok_per_s(bandwidth.read, weights, kv_token, [len(p) for p in prompts], new_tokens), 1
            ),
        }
        for name, seconds in times.items():
            rates = [bs * new_tokens / s for s in seconds]
            row[name] = {
                "tok_per_s": [round(x, 2) for x in rates],
                "median": round(statistics.median(rates), 2),
            }
        if theirs is not None:
            row["ratio"] = round(row["minisgl"]["median"] / row["transformers"]["median"], 2)
            # greedy output up to the first EOS: what the tests hold equal
            row["greedy_equal"] = all(
                _same_until_eos(a, b, eos)
                for a, b in zip(outputs["minisgl"], outputs["transformers"], strict=True)
            )
        rows.append(row)
    return {
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "rounds": rounds,
        "bandwidth_read_gbs": round(bandwidth.read, 2),
        "bandwidth_copy_gbs": round(bandwidth.copy, 2),
        "weight_bytes_per_step": weights,
        "kv_bytes_per_token": kv_token,
        "rows": rows,
    }


def markdown_table(result: dict[str, Any]) -> str:
    """The result as a markdown table (one row per batch size)."""
    has_theirs = "ratio" in result["rows"][0]
    head = "| batch | minisgl tok/s (runs) | bound tok/s | % of bound |"
    rule = "|---|---|---|---|"
    if has_theirs:
        head += " transformers tok/s (runs) | ratio | greedy equal |"
        rule += "---|---|---|"
    lines = [
        f"{result['threads']} threads, weights {result['weight_bytes_per_step'] / 1e6:.0f} MB/step, "
        f"read bandwidth {result['bandwidth_read_gbs']} GB/s (copy {result['bandwidth_copy_gbs']} GB/s), "
        f"{result['new_tokens']} new tokens per request, median of {result['rounds']} alternating runs",
        "",
        head,
        rule,
    ]
    for row in result["rows"]:
        ours = row["minisgl"]
        line = (
            f"| {row['batch_size']} | **{ours['median']}** ({', '.join(map(str, ours['tok_per_s']))}) "
            f"| {row['bound_tok_per_s']} | {100 * ours['median'] / row['bound_tok_per_s']:.0f}% |"
        )
        if has_theirs:
            theirs = row["transformers"]
            line += (
                f" {theirs['median']} ({', '.join(map(str, theirs['tok_per_s']))}) | **{row['ratio']}×** "
                f"| {'yes' if row['greedy_equal'] else 'NO'} |"
            )
        lines.append(line)
    return "\n".join(lines)
