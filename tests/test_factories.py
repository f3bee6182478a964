"""minisgl_core.testing factories: the trained tokenizer, random model directories, the demo model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from minisgl_core.testing import demo_model_dir, make_model_dir, pad_vocab, train_tokenizer


def test_tokenizer_loads_in_transformers_with_chatml(tmp_path: Path) -> None:
    started = time.perf_counter()
    train_tokenizer(tmp_path, vocab_size=1024)
    assert time.perf_counter() - started < 5
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 1024
    assert tokenizer.eos_token == "<|im_end|>"
    text = "Hello! How are you today? The quick brown fox, 1234 é 🙂"
    assert tokenizer.decode(tokenizer(text).input_ids) == text  # byte-level: lossless for any text
    english = "How are you today? The children walked to school through the green fields."
    assert len(tokenizer(english).input_ids) < len(english) / 2.5  # merges were learned
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        prompt
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    specials = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert tokenizer(prompt).input_ids.count(specials[1]) == 3  # special tokens are single ids
    assert tokenizer.decode(tokenizer(prompt).input_ids, skip_special_tokens=True).startswith(
        "system\nBe brief."
    )
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in config["chat_template"]


def test_model_dir_is_complete_and_seeded(tmp_path: Path) -> None:
    first = make_model_dir(tmp_path / "a", "Qwen3ForCausalLM", seed=0, num_hidden_layers=3)
    second = make_model_dir(tmp_path / "b", "Qwen3ForCausalLM", seed=0, num_hidden_layers=3)
    other = make_model_dir(tmp_path / "c", "Qwen3ForCausalLM", seed=1, num_hidden_layers=3)
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["num_hidden_layers"] == 3
    assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(first))
    generation = json.loads((first / "generation_config.json").read_text())
    vocab = json.loads((first / "tokenizer.json").read_text())["model"]["vocab"]
    assert generation["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    weights = [(d / "model.safetensors").read_bytes() for d in (first, second, other)]
    assert weights[0] == weights[1] and weights[0] != weights[2]


def test_model_dir_rejects_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FalconForCausalLM"):
        make_model_dir(tmp_path, "FalconForCausalLM")


def test_demo_model_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    path = demo_model_dir()
    assert path == tmp_path / "demo-qwen3"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"], config["vocab_size"]) == (
        256,
        4,
        64,
        2048,
    )
    assert config["tie_word_embeddings"] is True
    assert len(AutoTokenizer.from_pretrained(path)) == 2048
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert demo_model_dir() == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["demo-qwen3"]  # no staging directory left behind


def test_pad_vocab_makes_every_id_decode_to_text_and_keeps_encoding(tmp_path: Path) -> None:
    train_tokenizer(tmp_path, vocab_size=1024)
    before = AutoTokenizer.from_pretrained(tmp_path)
    text = "The children walked to school through the green fields. <|im_end|> 1234 é"
    ids = before(text).input_ids
    assert pad_vocab(tmp_path, 5000) == 5000 - len(before)
    after = AutoTokenizer.from_pretrained(tmp_path)
    assert len(after) == 5000
    assert after(text).input_ids == ids  # no merge reaches a filler word
    assert after.decode(ids) == text
    fillers = list(range(len(before), 5000))
    words = [after.decode([i]) for i in fillers]
    assert all(w.startswith(" ") and len(w) > 1 and w[1:].isalpha() for w in words)
    assert len(set(words)) == len(words)
    assert after.convert_tokens_to_ids("<|im_end|>") == before.convert_tokens_to_ids("<|im_end|>")
    assert pad_vocab(tmp_path, 5000) == 0  # idempotent


def test_added_tokens_are_text_and_special_added_tokens_are_special(tmp_path):
    """``added_tokens`` stay in decoded text (a reasoning model's ``<think>``);
    ``special_added_tokens`` are dropped by ``skip_special_tokens``, as Mistral's ``[TOOL_CALLS]``."""
    out = train_tokenizer(
        tmp_path, added_tokens=("<think>",), special_added_tokens=("[TOOL_CALLS]", "[ARGS]")
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.encode("<think>[TOOL_CALLS]get[ARGS]{}")
    assert (
        tokenizer.convert_tokens_to_ids("[TOOL_CALLS]") in ids
        and tokenizer.convert_tokens_to_ids("[ARGS]") in ids
    )
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<think>[TOOL_CALLS]get[ARGS]{}"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>get{}"
