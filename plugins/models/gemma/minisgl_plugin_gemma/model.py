"""Google Gemma, Gemma 2 and Gemma 3 (text; the multimodal checkpoints text-only): the shared
Llama-family decoder with Gemma's differences.

All three:

- the token embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the run dtype (as
  transformers' scaled embedding does); the LM head, tied to the same table, reads it unscaled.
  The first layer, which receives the embeddings, applies the factor;
- every RMS norm scales by ``1 + weight`` (its weights are stored around zero), in float32, then
  rounds (:class:`GemmaRMSNorm`);
- the MLP is ``gelu_tanh(gate) * up`` (``hidden_act`` / ``hidden_activation``
  ``gelu_pytorch_tanh``; Gemma's legacy ``gelu`` means the same, as transformers reads it);
- ``head_dim`` comes from config.json (256 for the released models, not hidden / heads).

Gemma 2 adds:

- four norms a layer: ``h = x + post_attention_norm(attn(input_norm(x)))``, then
  ``h + post_feedforward_norm(mlp(pre_feedforward_norm(h)))``;
- the softmax scale ``query_pre_attn_scalar ** -0.5``;
- attention logit soft-capping (``attn_logit_softcapping``: scores become ``cap * tanh(scores /
  cap)`` before the softmax), which the attention backend applies: the KV spec's
  ``logits_soft_cap`` (API 2.6; the core refuses a backend not declaring "soft_cap");
- final logit soft-capping (``final_logit_softcapping``) on the LM head's output, in
  :meth:`GemmaForCausalLM.logits_from`, which every logit the engine reads comes through
  (sampling, logprobs, prompt logprobs), eager, CUDA graphs and piecewise graphs alike;
- sliding-window attention (``sliding_window``, 4096 when unset) on alternate layers
  (``layer_types``; by default the even ones, as transformers' ``Gemma2Config``), which the
  attention backend applies: the KV spec's ``sliding_window``/``window_layers`` (API 2.7; the
  core refuses a backend not declaring "sliding_window" when the context is longer than the
  window, and a context of at most the window is exactly full attention).

Gemma 3 (``Gemma3ForCausalLM``, ``Gemma3TextConfig``: Gemma-3-1B's checkpoint) is Gemma 2's
layer, scale and window with:

- a per-head RMS norm on q and on k (``q_norm``/``k_norm``, ``head_dim`` weights, ``1 + weight``
  in float32) before the rotary;
- a rope per kind of layer: the sliding layers rotate with ``rope_local_base_freq`` (1e4), the
  full-attention ones with ``rope_theta`` (1e6) and the older configs' ``rope_scaling`` (linear,
  factor 8, in the 4B+ models); transformers 5 writes both as ``rope_parameters`` per layer type.
  The "default" and "linear" rope types are built, others refused (:func:`gemma3_rope`);
- ``layer_types``, where config.json has none, from ``sliding_window_pattern`` (6): layer ``i``
  attends fully when ``(i + 1) % pattern == 0`` (:func:`gemma3_layer_types`);
- no soft-caps by default (both keys null); ``final_logit_softcapping`` applies when set,
  ``attn_logit_softcapping`` never (transformers' Gemma 3 keeps the key but does not apply it);
- Gemma3TextConfig's defaults for the keys config.json leaves out, a tied LM head and
  ``max_position_embeddings`` 131072 among them (:meth:`Gemma3ForCausalLM.read_config`);
- ``use_bidirectional_attention`` refused.

``Gemma3ForConditionalGeneration`` (the multimodal 4B+ checkpoints) is served as its language
model alone, text only: ``text_config`` flattened (:func:`gemma3_text_config`), the language
model's tensors renamed from either layout and the vision tower's skipped
(:func:`text_model_name`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api import ForwardBatch, KVSpec, ModelConfig, ParallelContext
from minisgl_core.layers import (
    DecoderAttention,
    DecoderForCausalLM,
    MergedColumnParallelLinear,
    RowParallelLinear,
    load_full,
)
from minisgl_core.layers.decoder import Angles
from minisgl_core.layers.fused import fused
from minisgl_core.layers.weights import new_param

logger = logging.getLogger(__name__)

#: the activations Gemma's MLP is built with: the tanh approximation of GELU
TANH_GELU = frozenset({"gelu_pytorch_tanh"})


def _gemma_normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


@fused
def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * (1 + weight)`` in float32, rounded to ``x``'s dtype at the end (Gemma's norm;
    Llama's rounds before the weight)."""
    return _gemma_normalize(x, weight, eps)


@fused
def gemma_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gemma_rms_norm(x + residual), x + residual)``, the add in ``x``'s dtype."""
    total = x + residual
    return _gemma_normalize(total, weight, eps), total


@fused
def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` of ``gate_up = [gate | up]`` over the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class GemmaRMSNorm(nn.Module):
    """Gemma's RMS norm: scales by ``1 + weight``; called as the decoder's ``RMSNorm`` is
    (``norm(x)``, or ``norm(x, residual)`` for ``(norm(x + residual), x + residual)``)."""

    def __init__(self, dim: int, eps: float = 1e-6, *, dtype: torch.dtype | None, device: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param((dim,), dtype, device, load_full)
        self.weight.data.zero_()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return gemma_rms_norm(x, self.weight, self.eps)
        return gemma_add_rms_norm(x, residual, self.weight, self.eps)


class GemmaMLP(nn.Module):
    """``down(gelu_tanh(gate(x)) * up(x))``, no bias; each rank holds a slice of the width and
    ``down_proj`` sums them."""

    def __init__(
        self, hf: dict[str, Any], *, parallel: ParallelContext, dtype: torch.dtype | None, device: Any
    ) -> None:
        super().__init__()
        hidden, inter = hf["hidden_size"], hf["intermediate_size"]
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [inter, inter], parallel=parallel, bias=False, dtype=dtype, device=device
        )
        self.down_proj = RowParallelLinear(
            inter, hidden, parallel=parallel, bias=False, dtype=dtype, device=device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x)))


def embedding_scale(hf: dict[str, Any], dtype: torch.dtype | None) -> float:
    """``sqrt(hidden_size)`` rounded to the run dtype, as transformers multiplies the embeddings by
    it (3072's root, 55.43, is 55.5 in bfloat16)."""
    return float(torch.tensor(hf["hidden_size"] ** 0.5, dtype=dtype or torch.get_default_dtype()))


class GemmaDecoderLayer(nn.Module):
    """Gemma's pre-norm layer: ``h = x + attn(norm(x))``, then ``h + mlp(norm(h))``. Built and called
    as the decoder's ``DecoderLayer`` (see ``DecoderForCausalLM.layer_cls``): it takes and returns
    (branch output, residual stream), the residual add folded into the next norm."""

    #: each branch is summed across ranks in its own projection: the output is never a partial sum
    defers_sums = False
    #: the attention module, built as the decoder's ``DecoderAttention`` is (Gemma 3's adds norms)
    attention_cls: type[DecoderAttention] = DecoderAttention

    def __init__(
        self,
        hf: dict[str, Any],
        layer_id: int,
        *,
        qk_norm: bool,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
        qkv_bias: bool = False,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        eps, hidden = hf.get("rms_norm_eps", 1e-6), hf["hidden_size"]
        self.self_attn = self.attention_cls(
            hf, layer_id, qk_norm=False, parallel=parallel, dtype=dtype, device=device
        )
        self.mlp = mlp if mlp is not None else GemmaMLP(hf, parallel=parallel, dtype=dtype, device=device)
        self.input_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype, device=device)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype, device=device)
        #: the first layer receives the raw token embeddings and scales them
        self.embed_scale = embedding_scale(hf, dtype) if layer_id == 0 else None

    def embedded(
        self, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's input norm's output, the residual stream after adding ``hidden``)."""
        if residual is None:  # the first layer: the token embeddings, scaled as Gemma's are
            hidden = hidden * self.embed_scale
            return self.input_layernorm(hidden), hidden
        return self.input_layernorm(hidden, residual)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        angles: Angles | None = None,
        *,
        hidden_is_partial: bool = False,
        reduce_output: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden_is_partial`` and ``reduce_output`` are never set: see :attr:`defers_sums`."""
        normed, residual = self.embedded(hidden, residual)
        normed, residual = self.post_attention_layernorm(self.self_attn(normed, batch, angles), residual)
        return self.mlp(normed), residual


class Gemma2DecoderLayer(GemmaDecoderLayer):
    """Gemma 2's layer: a norm on each branch's output too, ``h = x + norm(attn(norm(x)))``, then
    ``h + norm(mlp(norm(h)))`` (``post_attention_layernorm`` is the attention output's norm here,
    ``pre_feedforward_layernorm`` the MLP input's)."""

    def __init__(self, hf: dict[str, Any], layer_id: int, **kwargs: Any) -> None:
        super().__init__(hf, layer_id, **kwargs)
        eps, hidden = hf.get("rms_norm_eps", 1e-6), hf["hidden_size"]
        dtype, device = kwargs["dtype"], kwargs["device"]
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype, device=device)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        angles: Angles | None = None,
        *,
        hidden_is_partial: bool = False,
        reduce_output: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.embedded(hidden, residual)
        attn_out = self.post_attention_layernorm(self.self_attn(normed, batch, angles))
        normed, residual = self.pre_feedforward_layernorm(attn_out, residual)
        return self.post_feedforward_layernorm(self.mlp(normed)), residual


def _cap_problem(hf: dict[str, Any], key: str) -> str | None:
    value = hf.get(key)
    if value is None or (
        not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf
    ):
        return None
    return f"{key} {json.dumps(value)} is not supported (a positive number, or null for none, is)"


class GemmaForCausalLM(DecoderForCausalLM):
    """Gemma (1): see the module docstring."""

    qk_norm = False
    layer_cls = GemmaDecoderLayer
    #: config.json's key naming the MLP's activation, and the legacy values read as the tanh GELU
    activation_key = "hidden_act"
    legacy_tanh_gelu = frozenset({"gelu"})
    #: the soft-cap keys this architecture reads, with the value of a key config.json leaves out
    #: (its config class's default); a null one caps nothing
    soft_caps: dict[str, float | None] = {}

    @classmethod
    def activation(cls, hf: dict[str, Any]) -> Any:
        """The MLP's activation as config.json names it (the config class's default when unset)."""
        value = hf.get(cls.activation_key)
        return "gelu_pytorch_tanh" if value is None else value

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        """An activation other than the tanh GELU, a soft-cap that is not a positive number, then
        the decoder's rules (rope, sliding window) for the rest."""
        act = cls.activation(hf)
        if act not in TANH_GELU | cls.legacy_tanh_gelu:
            return f"{cls.activation_key} {json.dumps(act)} is not supported (gelu_pytorch_tanh is)"
        for key in cls.soft_caps:
            problem = _cap_problem(hf, key)
            if problem is not None:
                return problem
        # (the decoder's activation rule is its SwiGLU MLP's, not this one's)
        return super().unsupported_setting({**cls.decoder_view(hf), "hidden_act": "silu"}, context_len)

    @classmethod
    def decoder_view(cls, hf: dict[str, Any]) -> dict[str, Any]:
        """config.json as the shared decoder's rules should read it."""
        return hf

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        hf = config.hf_config
        eps = hf.get("rms_norm_eps", 1e-6)
        self.model.norm = GemmaRMSNorm(hf["hidden_size"], eps, dtype=config.dtype, device=config.device)
        #: ``final_logit_softcapping`` (0.0: none)
        self.final_logit_softcap = self.soft_cap(hf, "final_logit_softcapping")
        self._gemma_kv_spec = self.gemma_kv_spec(super().kv_spec, hf)

    @classmethod
    def soft_cap(cls, hf: dict[str, Any], key: str) -> float:
        """config.json's soft-cap ``key`` (one of :attr:`soft_caps`), 0.0 for none."""
        if key not in cls.soft_caps:
            return 0.0
        return float(hf.get(key, cls.soft_caps[key]) or 0.0)

    def gemma_kv_spec(self, spec: KVSpec, hf: dict[str, Any]) -> KVSpec:
        """The decoder's KV spec, as this architecture changes it (Gemma 1: unchanged)."""
        return spec

    @property
    def kv_spec(self) -> KVSpec:
        return self._gemma_kv_spec

    def logits_from(self, states: tuple[torch.Tensor, ...], batch: ForwardBatch) -> torch.Tensor:
        """The decoder's logits, soft-capped to ``cap * tanh(logits / cap)`` in float32 when
        ``final_logit_softcapping`` is set (elementwise: a rank's slice of the vocabulary, under
        tensor parallelism, is capped alone)."""
        logits = super().logits_from(states, batch)
        cap = self.final_logit_softcap
        if not cap:
            return logits
        return torch.tanh(logits.float() / cap) * cap


class Gemma2ForCausalLM(GemmaForCausalLM):
    """Gemma 2: see the module docstring."""

    layer_cls = Gemma2DecoderLayer
    activation_key = "hidden_activation"
    legacy_tanh_gelu = frozenset()  # (Gemma2Config reads "gelu" as the exact GELU)
    soft_caps = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    #: ``sliding_window`` applies whenever it is set and some layer slides (``layer_types``)
    window_when_set = True

    @classmethod
    def decoder_view(cls, hf: dict[str, Any]) -> dict[str, Any]:
        """``sliding_window`` 4096 where config.json leaves it out (Gemma2Config's default), and
        none where ``layer_types`` lists no sliding layer (every layer attends fully)."""
        types = hf.get("layer_types")
        if isinstance(types, list) and "sliding_attention" not in types:
            return {key: value for key, value in hf.items() if key != "sliding_window"}
        return {"sliding_window": 4096, **hf}

    @classmethod
    def sliding_window_layers(cls, hf: dict[str, Any]) -> tuple[int, frozenset[int]]:
        """The decoder's rule on :meth:`decoder_view`, the sliding layers being the even ones
        where config.json has no ``layer_types`` (Gemma2Config's default)."""
        view = cls.decoder_view(hf)
        if "layer_types" not in view:
            layers = int(view["num_hidden_layers"])
            view["layer_types"] = [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
            ]
        return super().sliding_window_layers(view)

    def gemma_kv_spec(self, spec: KVSpec, hf: dict[str, Any]) -> KVSpec:
        """The softmax scale ``query_pre_attn_scalar ** -0.5`` (256 when unset, Gemma2Config's
        default) and the attention soft-cap."""
        scalar = hf.get("query_pre_attn_scalar")
        scale = float(256 if scalar is None else scalar) ** -0.5
        return dataclasses.replace(
            spec, scale=scale, logits_soft_cap=self.soft_cap(hf, "attn_logit_softcapping")
        )


#: Gemma 3's two kinds of layer (``layer_types``)
SLIDING, FULL = "sliding_attention", "full_attention"
#: the rope types Gemma 3's layers are built with (transformers' "default" and "linear")
GEMMA3_ROPE_TYPES = ("default", "linear")
#: each kind's rope theta where config.json gives none in ``rope_parameters``: the older top-level
#: key and Gemma3TextConfig's default
_GEMMA3_THETA = {SLIDING: ("rope_local_base_freq", 10_000.0), FULL: ("rope_theta", 1_000_000.0)}


def gemma3_layer_types(hf: dict[str, Any]) -> list[Any] | None:
    """Each layer's kind: config.json's ``layer_types``, else Gemma3TextConfig's default from
    ``sliding_window_pattern`` (6): layer ``i`` slides unless ``(i + 1) % pattern == 0``. None when
    the pattern is not a positive whole number (:meth:`Gemma3ForCausalLM.unsupported_setting`
    names it)."""
    types = hf.get("layer_types")
    if types is not None:
        return types
    pattern = hf.get("sliding_window_pattern", 6)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
        return None
    return [SLIDING if (i + 1) % pattern else FULL for i in range(int(hf["num_hidden_layers"]))]


def gemma3_rope(hf: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    """(the config.json key it comes from, the rope settings) of the layers of ``kind``, as
    Gemma3TextConfig reads them: transformers 5's ``rope_parameters[kind]``, else the default rope;
    an older config's ``rope_scaling`` applies to the full-attention layers only; the theta, where
    unset, is ``rope_local_base_freq`` (sliding) or ``rope_theta`` (full), else 1e4 or 1e6."""
    nested, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
    given = nested.get(kind) if isinstance(nested, dict) else None
    params = dict(given) if isinstance(given, dict) else {}
    theta_key, theta_default = _GEMMA3_THETA[kind]
    where = f"rope_parameters.{kind}" if params else theta_key
    if kind == FULL and isinstance(scaling, dict):
        params.update(scaling)
        where = "rope_scaling"
    params.setdefault("rope_theta", hf.get(theta_key, theta_default))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return where, params


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def _gemma3_rope_problem(hf: dict[str, Any]) -> str | None:
    nested, scaling = hf.get("rope_parameters"), hf.get("rope_scaling")
    if nested is not None and (not isinstance(nested, dict) or not set(nested) <= {SLIDING, FULL}):
        return (
            f"rope_parameters {json.dumps(nested)[:80]} is not supported: Gemma 3 reads one for each "
            f'layer type ("{SLIDING}", "{FULL}")'
        )
    if scaling is not None and not isinstance(scaling, dict):
        return f"rope_scaling {json.dumps(scaling)[:80]} is not supported (an object, or null)"
    for kind in (SLIDING, FULL):
        where, params = gemma3_rope(hf, kind)
        rope_type = params["rope_type"]
        if rope_type not in GEMMA3_ROPE_TYPES:
            return (
                f"{where} rope_type {json.dumps(rope_type)} is not supported "
                f"({', '.join(GEMMA3_ROPE_TYPES)} are)"
            )
        if not _number(params["rope_theta"]):
            name = where if where in (key for key, _ in _GEMMA3_THETA.values()) else f"{where} rope_theta"
            return f"{name} {json.dumps(params['rope_theta'])} is not supported (a positive number is)"
        if rope_type == "linear" and not _number(params.get("factor")):
            return (
                f"{where} factor {json.dumps(params.get('factor'))} is not supported (a positive number is)"
            )
        factor = params.get("partial_rotary_factor")
        if factor is not None and factor != 1.0:
            return f"{where} partial_rotary_factor {json.dumps(factor)} is not supported (whole heads are rotated)"
    return None


@fused
def gemma_qk_norm(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, num_q_heads: int, num_kv_heads: int,
    eps: float,
) -> torch.Tensor:  # fmt: skip
    """Gemma's RMS norm (``1 + weight``, float32) on each q head and each k head of ``qkv``
    (``[num_tokens, q_heads + 2 * kv_heads, head_dim]``), v unchanged."""
    q, k, v = qkv.split((num_q_heads, num_kv_heads, num_kv_heads), dim=1)
    return torch.cat((_gemma_normalize(q, q_weight, eps), _gemma_normalize(k, k_weight, eps), v), dim=1)


class Gemma3Attention(DecoderAttention):
    """The decoder's attention with Gemma 3's per-head ``q_norm``/``k_norm`` (``1 + weight``, in
    float32, before the rotary) and the rope of its layer's kind (:func:`gemma3_rope`)."""

    def __init__(
        self,
        hf: dict[str, Any],
        layer_id: int,
        *,
        qk_norm: bool,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
        qkv_bias: bool = False,
    ) -> None:
        types = gemma3_layer_types(hf)
        assert types is not None  # (refused by unsupported_setting)
        _, rope = gemma3_rope(hf, types[layer_id])
        # (the decoder builds its rotary from the config's rope settings: this layer's alone)
        view = {**hf, "rope_parameters": rope, "rope_scaling": None}
        super().__init__(view, layer_id, qk_norm=False, parallel=parallel, dtype=dtype, device=device)
        #: "sliding_attention" or "full_attention"
        self.layer_type = types[layer_id]
        head_dim, eps = self.attn.head_dim, hf.get("rms_norm_eps", 1e-6)
        # per head, the same weights on every rank; applied in project_qkv (head_qk_norm stays
        # False: the decoder's fused norm is Llama's, weight times the rounded normalised vector)
        self.q_norm = GemmaRMSNorm(head_dim, eps, dtype=dtype, device=device)
        self.k_norm = GemmaRMSNorm(head_dim, eps, dtype=dtype, device=device)

    def project_qkv(self, hidden: torch.Tensor) -> torch.Tensor:
        qkv = super().project_qkv(hidden)
        return gemma_qk_norm(
            qkv, self.q_norm.weight, self.k_norm.weight, self.attn.num_heads, self.attn.num_kv_heads,
            self.q_norm.eps,
        )  # fmt: skip


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    """Gemma 2's layer with :class:`Gemma3Attention`."""

    attention_cls = Gemma3Attention

    def __init__(self, hf: dict[str, Any], layer_id: int, **kwargs: Any) -> None:
        super().__init__(hf, layer_id, **kwargs)
        types = gemma3_layer_types(hf)
        assert types is not None
        # Off CUDA the model computes the rotary angles once a forward, with layer 0's rope, and
        # hands them to every layer (DecoderModel.forward): a layer whose rope is another kind's
        # computes its own from its inv_freq instead.
        self.own_angles = gemma3_rope(hf, types[layer_id])[1] != gemma3_rope(hf, types[0])[1]

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        angles: Angles | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(hidden, residual, batch, None if self.own_angles else angles, **kwargs)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 (text, ``Gemma3TextConfig``): see the module docstring."""

    layer_cls = Gemma3DecoderLayer
    #: none unless config.json sets it (Gemma3TextConfig's default is null). Not
    #: ``attn_logit_softcapping``: transformers' Gemma 3 keeps the key but never applies it (its
    #: attention passes no cap), so neither does the plugin
    soft_caps = {"final_logit_softcapping": None}

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        """Bidirectional attention, a ``sliding_window_pattern`` that is no pattern, a rope
        :func:`gemma3_rope` does not build, then Gemma 2's rules."""
        if hf.get("use_bidirectional_attention"):
            value = json.dumps(hf["use_bidirectional_attention"])
            return f"use_bidirectional_attention {value} is not supported (causal attention is)"
        types = gemma3_layer_types(hf)
        if types is None:
            pattern = json.dumps(hf.get("sliding_window_pattern"))
            return f"sliding_window_pattern {pattern} is not supported (a positive whole number is)"
        layers = hf.get("num_hidden_layers")
        if not isinstance(types, list) or len(types) != layers or not set(types) <= {SLIDING, FULL}:
            # (the decoder names it only where a window applies; each layer's rope needs it always)
            return (
                f"layer_types {json.dumps(types)[:80]} is not supported: one of "
                f'"{SLIDING}" or "{FULL}" for each of the {layers} layers'
            )
        return _gemma3_rope_problem(hf) or super().unsupported_setting(hf, context_len)

    @classmethod
    def decoder_view(cls, hf: dict[str, Any]) -> dict[str, Any]:
        """Gemma 2's view with :func:`gemma3_layer_types` as ``layer_types``, and without the rope
        keys (checked and built per layer kind here, not by the decoder's single-rope rules)."""
        rope_keys = ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq")
        view = {key: value for key, value in hf.items() if key not in rope_keys}
        types = gemma3_layer_types(hf)
        if types is not None:
            view["layer_types"] = types
        return super().decoder_view(view)

    @classmethod
    def read_config(cls, hf: dict[str, Any]) -> dict[str, Any]:
        """config.json with Gemma3TextConfig's defaults for the keys it leaves out (a tied head,
        ``max_position_embeddings`` 131072, not the engine's 4096...)."""
        return {**GEMMA3_TEXT_DEFAULTS, **hf}

    def __init__(self, config: ModelConfig) -> None:
        # (the core builds the model from read_config's view already; a test may not: idempotent)
        hf = type(self).read_config(config.hf_config)
        super().__init__(dataclasses.replace(config, hf_config=hf))


#: Gemma3TextConfig's defaults (as transformers 5.25 declares them) of the keys the model and the engine
#: read; the rope keys and ``layer_types`` default in :func:`gemma3_rope` and
#: :func:`gemma3_layer_types`. ``tie_word_embeddings`` True: Gemma-3-1B's checkpoint has no
#: lm_head tensor and its config.json does not say
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}

#: the multimodal config's keys that are its own, not the language model's (Gemma3Config)
_MULTIMODAL_KEYS = frozenset(
    {"text_config", "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
     "image_token_index", "boi_token_id", "eoi_token_id", "image_token_id"}
)  # fmt: skip
#: top-level keys of the multimodal config that apply to the language model over its text_config's:
#: the run dtype, the token ids generation ends on (the -it models' [1, 106]), the head's tie
#: (Gemma3Config's own, default True, ties the language model's head)
_TOP_LEVEL_WINS = (
    "torch_dtype",
    "dtype",
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
)
#: (prefix in the checkpoint, prefix in the text model's) of the language model's tensors: the
#: released checkpoints' (transformers 4.5x), which transformers 5's ``save_pretrained`` still
#: writes, and the names of transformers 5's modules (its state dict)
_LANGUAGE_MODEL_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
)
#: the vision tower's and the projector's tensors, in either layout: images are not served
_VISION_PREFIXES = (
    "vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.",
)  # fmt: skip


def gemma3_text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a ``Gemma3ForConditionalGeneration`` config.json, flat:
    ``text_config`` over the top-level keys (less the multimodal ones), with the top-level
    :data:`_TOP_LEVEL_WINS` over it and Gemma3TextConfig's defaults under both; ``architectures``
    stays the top level's. A config without ``text_config`` is already flat."""
    if "text_config" not in hf:
        return hf
    text = hf.get("text_config") or {}
    top = {key: value for key, value in hf.items() if key not in _MULTIMODAL_KEYS}
    wins = {key: hf[key] for key in _TOP_LEVEL_WINS if key in hf}
    flat = {**top, **text, **wins}
    flat["architectures"] = hf.get("architectures")
    return flat


def text_model_name(name: str) -> str | None:
    """The text model's name (``model.layers.0...``, ``lm_head.weight``) of a multimodal
    checkpoint's tensor, in either layout; None for the vision tower's and the projector's."""
    if name.startswith(_VISION_PREFIXES):
        return None
    for prefix, text_prefix in _LANGUAGE_MODEL_PREFIXES:
        if name.startswith(prefix):
            return text_prefix + name[len(prefix) :]
    return name  # (the module layout's lm_head.weight)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """Gemma 3's multimodal checkpoints (4B, 12B, 27B and their -it variants) served text-only:
    the language model of ``text_config`` (:func:`gemma3_text_config`), its tensors renamed to
    the text model's (:func:`text_model_name`); the vision tower and the projector are skipped,
    and a request (text only) never needs them."""

    @classmethod
    def read_config(cls, hf: dict[str, Any]) -> dict[str, Any]:
        return super().read_config(gemma3_text_config(hf))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The language model's tensors, under the text model's names; returns the checkpoint's
        names of those it used and of the vision tower's, which it skips by design (so the core
        does not warn of them as tensors the model did not use)."""
        checkpoint_names: dict[str, str] = {}
        skipped: set[str] = set()

        def renamed() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                text_name = text_model_name(name)
                if text_name is None:
                    # (the format has read it from disk as it streamed past; dropped here)
                    skipped.add(name)
                    del tensor
                    continue
                checkpoint_names[text_name] = name
                yield text_name, tensor

        used = super().load_weights(renamed())
        if skipped:
            logger.info(
                "serving text only: skipped the %d tensors of the vision tower and projector", len(skipped)
            )
        return {checkpoint_names.get(name, name) for name in used} | skipped
