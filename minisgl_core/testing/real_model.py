"""The real default model (SmolLM2-135M-Instruct, GGUF Q4_1) and its ``transformers`` reference.

Shared by the offline and the server tests on real weights: the model file is fetched once per
run into ``$MINISGL_CACHE_DIR`` (``resolve_model(None)``, the product's own path) and the
reference greedy outputs are computed once per session (float32, CPU, transformers loading the
same GGUF with ``gguf_file=``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

#: enough new tokens to see an answer take shape, few enough for 2 CPU cores in CI
MAX_TOKENS = 28

_LONG_TEXT = (
    "The Amazon rainforest covers much of the Amazon basin of South America. The basin spans "
    "about seven million square kilometres, of which five and a half million are covered by the "
    "forest. The region includes territory belonging to nine nations. The majority of the forest "
    "lies in Brazil, followed by Peru and Colombia, with minor amounts in Venezuela, Ecuador, "
    "Bolivia, Guyana, Suriname and French Guiana. The rainforest represents over half of the "
    "planet's remaining rainforests and is the largest and most biodiverse tract of tropical "
    "rainforest in the world, with an estimated 390 billion individual trees divided into 16,000 "
    "species. More than 30 million people of 350 different ethnic groups live in the Amazon, and "
    "they are subdivided into 9 different national political systems and 3,344 formally "
    "acknowledged indigenous territories. "
) * 3

#: (label, chat messages): multi-turn, non-English, long input, an early end, code, a system prompt
PROMPTS: list[tuple[str, list[dict[str, str]]]] = [
    ("capital", [{"role": "user", "content": "What is the capital of France?"}]),
    (
        "multi-turn",
        [
            {"role": "user", "content": "My name is Ada and I like chess."},
            {"role": "assistant", "content": "Nice to meet you, Ada! Chess is a great game."},
            {"role": "user", "content": "What is my name, and which game do I like?"},
        ],
    ),
    ("french", [{"role": "user", "content": "Quelle est la couleur du ciel par beau temps ?"}]),
    ("spanish", [{"role": "user", "content": "¿Cuántos días tiene una semana? Responde en español."}]),
    ("long-input", [{"role": "user", "content": _LONG_TEXT + "\nSummarize the text above in one sentence."}]),
    ("early-eos", [{"role": "user", "content": "Reply with exactly one word: is water wet?"}]),
    ("code", [{"role": "user", "content": "Write a Python function that returns the sum of two numbers."}]),
    (
        "system",
        [
            {"role": "system", "content": "You are a pirate. Always talk like a pirate."},
            {"role": "user", "content": "Say hello to my friend."},
        ],
    ),
    ("math", [{"role": "user", "content": "What is 12 plus 7?"}]),
]


@dataclass(frozen=True)
class Reference:
    """transformers' greedy continuation of one prompt."""

    label: str
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    output_ids: list[int]
    text: str


def gguf_file(model_dir: str | Path) -> Path:
    [path] = Path(model_dir).glob("*.gguf")
    return path


def transformers_references(model_dir: str | Path) -> list[Reference]:
    """Greedy outputs of ``transformers`` (float32, CPU, eager attention) for :data:`PROMPTS`.

    Prompts of similar length (the longest at most three times the shortest) go through one
    ``generate`` call, left-padded with an attention mask: 28 steps of a batch instead of 28 of
    each prompt (one at a time the 9 prompts took 15.6 s, most of it per-step overhead); the long
    prompt runs alone rather than pad the others to its length. Each row's tokens end at its first
    end-of-turn (the rows that end early are padded after it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_file(model_dir)
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = []
    for _, messages in PROMPTS:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = list(ids["input_ids"])
        prompts.append(list(ids))
    outputs: dict[int, list[int]] = {}
    for group in _similar_lengths([len(ids) for ids in prompts]):
        width = max(len(prompts[i]) for i in group)
        padded = [[eos] * (width - len(prompts[i])) + prompts[i] for i in group]
        mask = [[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in group]
        with torch.inference_mode():
            out = model.generate(
                torch.tensor(padded),
                attention_mask=torch.tensor(mask),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        for i, row in zip(group, out[:, width:].tolist(), strict=True):
            outputs[i] = row[: row.index(eos) + 1] if eos in row else row
    references = []
    for i, (label, messages) in enumerate(PROMPTS):
        output = outputs[i]
        text = tokenizer.decode([t for t in output if t != eos], skip_special_tokens=True)
        references.append(Reference(label, messages, prompts[i], output, text))
    return references


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers reads the GGUF file's header three times (for the tokenizer, the config and the
    weights) and builds gguf's tensor-name map once per module of the model (397 times), the same
    answers each time: within this block each is built once (the references took 31 s, now 20 s,
    on the dev machine). transformers only reads both, and imports them from gguf at each call,
    so it finds these."""
    from unittest import mock

    import gguf

    with (
        mock.patch.object(gguf, "GGUFReader", functools.cache(gguf.GGUFReader)),
        mock.patch.object(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)),
    ):
        yield


def _similar_lengths(lengths: list[int]) -> list[list[int]]:
    """Indices of ``lengths`` in groups, by increasing length, whose longest is at most three
    times their shortest."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if groups and lengths[i] <= 3 * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
