"""minisgl's own part of the tokenizer and detokenizer processes never imports torch: loading every
plugin (for the fingerprint check), the worker module, the model's sampling defaults and the
request-limit check are plain Python. (transformers 5 itself imports torch when AutoTokenizer
loads a tokenizer, through its configuration module; that part is measured, not asserted.)"""

from __future__ import annotations

import json
import subprocess
import sys

from minisgl_core.demo.factories import train_tokenizer

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
