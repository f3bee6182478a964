"""Phi-3 / Phi-4: the shared Llama-family decoder; the checkpoint stores q, k and v as one
``qkv_proj`` tensor and gate and up as one ``gate_up_proj``, which are split here into the pieces
the decoder's loaders shard (each rank takes its heads of q, k and v, its rows of gate and up)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from minisgl_core.layers import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    window_when_set = True  # Phi-3-mini-4k's sliding_window 2047 applies, with no switch

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        hf = self.config.hf_config
        heads, kv_heads = (
            hf["num_attention_heads"],
            hf.get("num_key_value_heads") or hf["num_attention_heads"],
        )
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        rows = {
            ".self_attn.qkv_proj.weight": sum(sizes),
            ".mlp.gate_up_proj.weight": 2 * hf["intermediate_size"],
        }
        fused_name: dict[str, str] = {}  # a piece's name -> the checkpoint tensor it came from

        def pieces() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                fused = next((suffix for suffix in rows if name.endswith(suffix)), None)
                if fused is not None and (tensor.dim() != 2 or tensor.shape[0] != rows[fused]):
                    raise ValueError(
                        f"{name} has shape {list(tensor.shape)}; config.json implies {rows[fused]} rows: "
                        "config.json does not describe these weights"
                    )
                if fused == ".self_attn.qkv_proj.weight":
                    parts = zip(("q_proj", "k_proj", "v_proj"), tensor.split(sizes), strict=True)
                    split = [(name.replace(".qkv_proj.", f".{part}."), piece) for part, piece in parts]
                elif fused == ".mlp.gate_up_proj.weight":
                    gate, up = tensor.chunk(2)  # gate first, as Phi3MLP reads it
                    split = [(name.replace(".gate_up_proj.", ".gate_proj."), gate),
                             (name.replace(".gate_up_proj.", ".up_proj."), up)]  # fmt: skip
                else:
                    yield name, tensor
                    continue
                for piece_name, piece in split:
                    fused_name[piece_name] = name
                    yield piece_name, piece

        return {fused_name.get(name, name) for name in super().load_weights(pieces())}
