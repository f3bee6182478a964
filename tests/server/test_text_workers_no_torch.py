"""The tokenizer and detokenizer processes never import torch: loading every plugin (for the
fingerprint check), the worker module, the model's sampling defaults and the request-limit check
are plain Python, the GGUF format opens a file without it, and the workers load their tokenizer
with transformers told torch is absent (``import_transformers_without_torch``: transformers 5
imports torch whenever it is installed), with the same token ids and chat renderings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl_core.demo.factories import train_tokenizer

from .conftest import ENGINE_ARGS

# Runs in a fresh interpreter: this test process has long imported torch.
CHILD = r"""
import json, sys
from minisgl_core.messages import Limits, StepOutputs, TokenizeRequest
from minisgl_core.plugins import Plugins
from minisgl_core.processes.text_workers import Admitter, Detokenizer, RequestRejected
from minisgl_core.sampling import SamplingParams, merge_sampling, sampling_defaults
from minisgl_core.model_dir import load_generation_config
from minisgl_core.tokenizer.load import load_tokenizer_dir as load_tokenizer

model_dir = sys.argv[1]
plugins = Plugins.load()
defaults = load_generation_config(model_dir)
torch_before_tokenizer = "torch" in sys.modules
tokenizer = load_tokenizer(model_dir)
admitter = Admitter(tokenizer, Limits(max_context_len=64, kv_capacity_tokens=64, vocab_size=len(tokenizer)),
                    defaults)
# the API server merges the model's defaults into the request's one SamplingParams
ids, params = admitter.admit(TokenizeRequest(rids=[0], text="hello world", messages=None, input_ids=None,
                                             params=SamplingParams(**merge_sampling({"max_tokens": 4}, sampling_defaults(defaults)))))
try:
    admitter.admit(TokenizeRequest(rids=[1], text="hello", messages=None, input_ids=None,
                                   params=SamplingParams(max_tokens=1000)))
    rejected = None
except RequestRejected as exc:
    rejected = exc.param
Detokenizer(tokenizer)
print(json.dumps({
    "torch": torch_before_tokenizer,
    "plugins_ok": sorted(i.name for i in plugins.infos if i.status == "ok"),
    "ids": ids,
    "max_tokens": params.max_tokens,
    "temperature": params.temperature,
    "rejected": rejected,
}))
"""


def test_tokenizer_process_code_never_imports_torch(tmp_path):
    train_tokenizer(tmp_path, vocab_size=300)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tmp_path).encode("hello world", add_special_tokens=False)
    assert result["ids"] == reference
    assert result["max_tokens"] == 4
    assert result["temperature"] == 0.5  # the model's generation_config.json default
    assert result["rejected"] == "max_tokens"  # 1000 tokens cannot fit a 64-token context
    # The check means something only if plugins really loaded: every model, attention, cache
    # and policy plugin's entry module imports minisgl_core.api.
    assert {"llama", "qwen3", "torch", "radix"} <= set(result["plugins_ok"])
    assert result["torch"] is False


# The workers' own start-up (text_workers.load_worker_tokenizer), in a fresh interpreter.
WORKER = r"""
import json, sys
from minisgl_core.plugins import Plugins
from minisgl_core.processes.child import ChildSpec
from minisgl_core.processes.text_workers import load_worker_tokenizer
from minisgl_core.tokenizer.load import apply_chat_template, render_chat_template

role, model, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = ChildSpec(role=role, endpoints=None, fingerprint="", disable_plugins=(), log_level="info",
                 launcher_pid=0, payload={"model": model})
tokenizer = load_worker_tokenizer(spec, Plugins.load())
text = "Hello, wörld! 你好 <|im_start|>"
ids = tokenizer.encode(text)
print(json.dumps({
    "torch": "torch" in sys.modules,
    "class": type(tokenizer).__name__,
    "ids": ids,
    "decoded": tokenizer.decode(ids),
    "tokens": tokenizer.convert_ids_to_tokens(ids),
    "vocab": len(tokenizer.get_vocab()),
    "chat": render_chat_template(tokenizer, messages),
    "chat_ids": apply_chat_template(tokenizer, messages),
}))
"""

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.mark.parametrize("role", ["tokenizer", "detokenizer"])
def test_worker_loads_the_default_model_tokenizer_without_torch(default_model_dir: Path, role, tmp_path):
    """The default model (GGUF) through the workers' own load: no torch (it was imported by the
    GGUF format module and by transformers: 2-4 CPU-seconds a process), and the tokenizer the same
    as one loaded with torch, in this process: ids, text, tokens, vocabulary and chat renderings.
    A fresh tokenizer cache the first time, so the conversion from the GGUF file runs torch-less too."""
    from minisgl_core.tokenizer.load import apply_chat_template, load_tokenizer, render_chat_template

    env = dict(os.environ)
    if role == "tokenizer":
        env["MINISGL_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, role, str(default_model_dir), json.dumps(MESSAGES)],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "PyTorch was not found" not in out.stderr  # transformers' note: not news to an operator
    reference = load_tokenizer(default_model_dir)
    ids = reference.encode("Hello, wörld! 你好 <|im_start|>")
    assert result["class"] == type(reference).__name__
    assert result["ids"] == ids
    assert result["decoded"] == reference.decode(ids)
    assert result["tokens"] == reference.convert_ids_to_tokens(ids)
    assert result["vocab"] == len(reference.get_vocab())
    assert result["chat"] == render_chat_template(reference, MESSAGES)
    assert result["chat_ids"] == apply_chat_template(reference, MESSAGES)
    assert result["torch"] is False


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_served_text_workers_have_no_torch_loaded(start_server, model_dir):
    """The real server's tokenizer and detokenizer processes (a model directory, AutoTokenizer's
    path) have no torch library mapped; the scheduler rank has (so the check can tell). A server of
    its own: the session's shared one may have served a grammar, whose backend (xgrammar) imports
    torch in the tokenizer process when the first one comes (CI found it so)."""
    server = start_server(["--model", str(model_dir), *ENGINE_ARGS])
    roles = {Path(f"/proc/{pid}/comm").read_text().strip(): pid for pid in server.children()}
    assert "libtorch" in _mapped_libraries(roles["minisgl-sched0"])
    for role in ("minisgl-tok", "minisgl-detok"):
        assert "libtorch" not in _mapped_libraries(roles[role]), role
