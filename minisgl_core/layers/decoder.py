"""The shared Llama-family decoder (pre-norm blocks, GQA with rope, SwiGLU MLP).

Model plugins subclass :class:`DecoderForCausalLM` and set flags (``qk_norm`` for Qwen3,
``qkv_bias`` for Qwen2) instead of copying the model; bias and tied embeddings come from the config."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from minisgl_core.api.batch import ForwardBatch
from minisgl_core.api.model import KVSpec, Model, ModelConfig
from minisgl_core.api.parallel import ParallelContext
from minisgl_core.layers.attention import AttentionLayer
from minisgl_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl_core.layers.fused import qkv_norm_rope, silu_and_mul
from minisgl_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl_core.layers.norm import RMSNorm
from minisgl_core.layers.rotary import get_rope
from minisgl_core.layers.triton_ops import float8_stores, fused_kv_enabled, rope_store_kv

#: a forward's rotary cos and sin, ``[num_tokens, 1, head_dim]`` each (see ``DecoderModel.forward``)
Angles = tuple[torch.Tensor, torch.Tensor]

#: layer index -> that layer's MLP (a module whose ``forward(x, reduce)`` is :class:`DecoderMLP`'s),
#: for models whose MLP is another kind in some layers (a mixture of experts)
MLPFactory = Callable[[int], nn.Module]


class DecoderAttention(nn.Module):
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
        super().__init__()
        hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = _head_dim(hf)
        bias = bool(hf.get("attention_bias", False))
        self.qkv_proj = QKVParallelLinear(
            hidden,
            head_dim,
            heads,
            hf.get("num_key_value_heads") or heads,
            parallel=parallel,
            bias=bias or qkv_bias,
            dtype=dtype,
            device=device,
        )
        num_heads, num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            heads * head_dim, hidden, parallel=parallel, bias=bias, dtype=dtype, device=device
        )
        eps = hf.get("rms_norm_eps", 1e-6)
        #: whether q_norm and k_norm are per-head norms this forward applies (a subclass may own
        #: norms of those names that it applies itself, in :meth:`project_qkv`: OLMo 2's)
        self.head_qk_norm = qk_norm
        self.q_norm = RMSNorm(head_dim, eps, dtype=dtype, device=device) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps, dtype=dtype, device=device) if qk_norm else None
        self.rotary_emb = get_rope(hf, head_dim).to(device)
        self.attn = AttentionLayer(layer_id, num_heads, num_kv_heads, head_dim)

    def project_qkv(self, hidden: torch.Tensor) -> torch.Tensor:
        """The fused q/k/v projection as ``[num_tokens, q_heads + 2 * kv_heads, head_dim]``, before
        any per-head norm and rotary; a subclass that transforms the projection first (OLMo 2's
        norms over whole q and k vectors) overrides this."""
        return self.qkv_proj(hidden).view(hidden.shape[0], -1, self.attn.head_dim)

    def forward(
        self,
        hidden: torch.Tensor,
        batch: ForwardBatch,
        angles: Angles | None = None,
        reduce: bool = True,
    ) -> torch.Tensor:
        """``angles``: the rotary cos/sin of ``batch.positions`` the model computed for every layer,
        or None (each layer's kernel computes them: CUDA). ``reduce=False``: o_proj's partial sum
        (no bias only; see ``RowParallelLinear``), for the norm after it (on one GPU possibly split-K
        partials, ``split_k``)."""
        num_heads, num_kv_heads = self.attn.num_heads, self.attn.num_kv_heads
        qkv = self.project_qkv(hidden)
        q_weight = self.q_norm.weight if self.head_qk_norm else None
        k_weight = self.k_norm.weight if self.head_qk_norm else None
        eps = self.q_norm.eps if self.head_qk_norm else 0.0
        inv_freq = self.rotary_emb.inv_freq
        cache = batch.attn.config.kv_cache
        if (
            "prestored_kv" in batch.attn.capabilities
            and fused_kv_enabled(qkv.device)
            and (
                cache.dtype == qkv.dtype or (cache.dtype == torch.float8_e4m3fn and float8_stores(qkv.device))
            )
        ):
            # norm + rotary, k and v written to the KV pool (a float8 one saturated, as
            # KVCache.store writes it; sm89+ GPUs only), in one kernel; the backend is told the
            # pool already holds them (API 1.5)
            q = rope_store_kv(
                qkv, batch.positions, inv_freq, q_weight, k_weight, num_heads, num_kv_heads, eps,
                cache, self.attn.layer_id, batch.out_cache_loc,
            )  # fmt: skip
            return self.o_proj(self.attn.attend(q, batch), reduce, split_k=not reduce)
        # q/k norm and rotary on the q and k heads, v copied beside k (one kernel on CUDA): k and
        # v of a token are then adjacent, which lets the KV pool store both with one kernel
        qkv = qkv_norm_rope(
            qkv, batch.positions, inv_freq, q_weight, k_weight, num_heads, num_kv_heads, eps, angles
        )
        q, k, v = qkv.split((num_heads, num_kv_heads, num_kv_heads), dim=1)
        return self.o_proj(self.attn(q, k, v, batch), reduce, split_k=not reduce)


class DecoderMLP(nn.Module):
    def __init__(
        self, hf: dict[str, Any], *, parallel: ParallelContext, dtype: torch.dtype | None, device: Any
    ) -> None:
        super().__init__()
        unsupported = _unsupported_activation(hf)
        if unsupported is not None:
            raise NotImplementedError(unsupported)
        hidden, inter, bias = hf["hidden_size"], hf["intermediate_size"], bool(hf.get("mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden, [inter, inter], parallel=parallel, bias=bias, dtype=dtype, device=device
        )
        self.down_proj = RowParallelLinear(
            inter, hidden, parallel=parallel, bias=bias, dtype=dtype, device=device
        )

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """``reduce=False``: down_proj's partial sum (no bias only; see ``RowParallelLinear``), for
        the norm after it (on one GPU possibly split-K partials, ``split_k``)."""
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)), reduce, split_k=not reduce)


class DecoderLayer(nn.Module):
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
        eps = hf.get("rms_norm_eps", 1e-6)
        self.self_attn = DecoderAttention(
            hf, layer_id, qk_norm=qk_norm, parallel=parallel, dtype=dtype, device=device, qkv_bias=qkv_bias
        )
        # ``mlp``: another MLP (see MLPFactory); by default the dense SwiGLU one
        self.mlp = mlp if mlp is not None else DecoderMLP(hf, parallel=parallel, dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(hf["hidden_size"], eps, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(hf["hidden_size"], eps, dtype=dtype, device=device)
        # o_proj's and down_proj's sums are left to the norm after them (RMSNorm's partial_of):
        # under tensor parallelism it fuses the all-reduce with the residual add and norm where it
        # can; on one GPU it adds a split-K GEMM's partial sums there (a kernel fewer). With a bias
        # the sum must come before the bias, so they reduce as usual.
        self.parallel = parallel
        self.defers_sums = not _bias_in(hf)

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
        """Takes and returns (branch output, residual stream): each residual add is folded into
        the norm that follows it (the last one into the model's final norm). ``angles``: see
        :meth:`DecoderAttention.forward`. ``hidden_is_partial``: ``hidden`` is the previous layer's
        MLP output as this rank's partial sum (``reduce_output=False`` there), summed here."""
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            partial_of = self.parallel if hidden_is_partial else None
            normed, residual = self.input_layernorm(hidden, residual, partial_of=partial_of)
        defer = self.defers_sums
        attn_out = self.self_attn(normed, batch, angles, reduce=not defer)
        normed, residual = self.post_attention_layernorm(
            attn_out, residual, partial_of=self.parallel if defer else None
        )
        return self.mlp(normed, reduce=reduce_output or not defer), residual


class DecoderModel(nn.Module):
    def __init__(
        self,
        hf: dict[str, Any],
        *,
        qk_norm: bool,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
        qkv_bias: bool = False,
        mlp_factory: MLPFactory | None = None,
        layer_cls: type[nn.Module] | None = None,
    ) -> None:
        """``layer_cls``: another layer (see :attr:`DecoderForCausalLM.layer_cls`); by default
        :class:`DecoderLayer`."""
        super().__init__()
        layer_cls = layer_cls or DecoderLayer
        self.embed_tokens = VocabParallelEmbedding(
            hf["vocab_size"], hf["hidden_size"], parallel=parallel, dtype=dtype, device=device
        )
        self.layers = nn.ModuleList(
            layer_cls(
                hf,
                i,
                qk_norm=qk_norm,
                parallel=parallel,
                dtype=dtype,
                device=device,
                qkv_bias=qkv_bias,
                mlp=mlp_factory(i) if mlp_factory is not None else None,
            )  # fmt: skip
            for i in range(hf["num_hidden_layers"])
        )
        self.norm = RMSNorm(hf["hidden_size"], hf.get("rms_norm_eps", 1e-6), dtype=dtype, device=device)

    def forward(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(last layer's MLP output, residual stream) of every new token; their sum, put
        through ``self.norm``, is the final hidden state."""
        hidden, residual = self.embed_tokens(batch.input_ids), None
        # Every layer rotates by the same angles (one rope config, the same positions). Off CUDA
        # they are computed here once and passed down; on CUDA each layer's fused kernel computes
        # them in registers, cheaper than reading them back.
        angles = None
        if not batch.positions.is_cuda:
            angles = self.layers[0].self_attn.rotary_emb.angles(batch.positions, hidden.dtype)
        last = len(self.layers) - 1
        partial = False  # whether hidden is the previous layer's partial sum (see DecoderLayer)
        for i, layer in enumerate(self.layers):
            reduce = i == last or not layer.defers_sums
            hidden, residual = layer(
                hidden, residual, batch, angles, hidden_is_partial=partial, reduce_output=reduce
            )
            partial = not reduce
        return hidden, residual


# HF checkpoint name part -> (our fused parameter name part, shard id)
_FUSED = {
    ".q_proj.": (".qkv_proj.", "q"),
    ".k_proj.": (".qkv_proj.", "k"),
    ".v_proj.": (".qkv_proj.", "v"),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


class DecoderForCausalLM(Model):
    """Llama-style decoder: pre-norm blocks, GQA with rotary embedding, SwiGLU MLP.

    Subclasses set the class flags; attention/MLP bias and tied embeddings come from the config."""

    #: per-head RMS norm on q and k before rope (Qwen3)
    qk_norm: bool = False
    #: a bias on the q, k and v projections whatever config.json says (Qwen2, whose config has no
    #: such key); config.json's ``attention_bias`` gives one to all four projections, o_proj too
    qkv_bias: bool = False
    #: config.json's ``sliding_window`` applies whenever it is set (Mistral, Phi-3), not only under
    #: ``use_sliding_window`` (Qwen2). One shorter than the context the engine runs goes to the
    #: attention backends (``KVSpec.sliding_window``, API 2.7: :meth:`sliding_window_layers` says
    #: where); one at least as long is full attention, which every backend computes
    window_when_set: bool = False
    #: the layer class, built as :class:`DecoderLayer` is and called as it is (taking and returning
    #: ``(branch output, residual stream)``, with a ``defers_sums`` attribute): for a model whose
    #: norms sit elsewhere in the block (OLMo 2's after each branch); None: :class:`DecoderLayer`
    layer_cls: type[nn.Module] | None = None

    @classmethod
    def read_config(cls, hf: dict[str, Any]) -> dict[str, Any]:
        """config.json as this model and the engine read it: unchanged here. A subclass whose
        checkpoints nest the language model (``text_config``) or leave out keys whose defaults are
        its config class's, not the engine's (``max_position_embeddings`` 4096), returns the flat
        config with them; the core reads the model's sizes from it
        (:func:`minisgl_core.checkpoint.buildable.model_config`) and builds the model from it."""
        return hf

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        """The first config.json setting this decoder cannot build, as one line naming the setting
        and its value ("hidden_act 'gelu' is not supported (silu is)"); None when it can build the
        rest. ``context_len``: the longest sequence the engine will run (None: the config's
        ``max_position_embeddings``), for a subclass whose rules depend on it. The
        constructor raises NotImplementedError with it; the launcher asks it first, so the user
        reads that line before any process starts. A subclass that builds more (another rope,
        say) overrides this with its own rules."""
        for check in (_unsupported_activation, _unsupported_rope):
            unsupported = check(hf)
            if unsupported is not None:
                return unsupported
        return _unsupported_sliding_window(hf, cls.window_when_set)

    @classmethod
    def sliding_window_layers(cls, hf: dict[str, Any]) -> tuple[int, frozenset[int]]:
        """The sliding window config.json asks for and the layers it applies in; ``(0, {})`` for
        none. It applies under ``use_sliding_window`` (Qwen2), or whenever ``sliding_window`` is
        set with :attr:`window_when_set` (Mistral, Phi-3); in the layers ``layer_types`` calls
        ``"sliding_attention"`` where config.json lists them, else in every layer from
        ``max_window_layers`` on under ``use_sliding_window`` (Qwen2Config's default, 28), else in
        every layer. A subclass whose config has other defaults (Gemma 2) overrides it."""
        window = hf.get("sliding_window")
        applies = hf.get("use_sliding_window") or (cls.window_when_set and window is not None)
        if not applies or _window_problem(hf) is not None:
            return 0, frozenset()
        num_layers = int(hf["num_hidden_layers"])
        types = hf.get("layer_types")
        if isinstance(types, list):
            return window, frozenset(i for i, kind in enumerate(types) if kind == "sliding_attention")
        if hf.get("use_sliding_window"):
            # (transformers slides layer i where i >= max_window_layers: below 0, every layer; a
            # range from -2**40 was a MemoryError)
            first = max(hf.get("max_window_layers", 28), 0)
            return window, frozenset(range(first, num_layers))
        return window, frozenset(range(num_layers))

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        hf, parallel = config.hf_config, config.parallel
        dtype, device = config.dtype, config.device
        unsupported = unsupported_for(type(self), hf, config.max_context_len)
        if unsupported is not None:
            raise NotImplementedError(unsupported)
        self.model = DecoderModel(
            hf, qk_norm=self.qk_norm, qkv_bias=self.qkv_bias, parallel=parallel, dtype=dtype, device=device,
            mlp_factory=self.mlp_factory(config), layer_cls=self.layer_cls,
        )  # fmt: skip
        self.lm_head = ParallelLMHead(
            hf["vocab_size"], hf["hidden_size"], parallel=parallel, dtype=dtype, device=device
        )
        self.tie_word_embeddings = bool(hf.get("tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        first = self.model.layers[0].self_attn.attn
        window, window_layers = type(self).sliding_window_layers(hf)
        max_pos = int(hf.get("max_position_embeddings", 4096))
        context = min(config.max_context_len or max_pos, max_pos)
        if window >= context or not window_layers:  # no sequence outgrows it: full attention
            window, window_layers = 0, frozenset()
        self._kv_spec = KVSpec(
            num_layers=len(self.model.layers),
            num_qo_heads=first.num_heads,
            num_kv_heads=first.num_kv_heads,
            head_dim=first.head_dim,
            scale=first.head_dim**-0.5,
            sliding_window=window,
            window_layers=window_layers,
        )

    @property
    def kv_spec(self) -> KVSpec:
        return self._kv_spec

    def mlp_factory(self, config: ModelConfig) -> MLPFactory | None:
        """Each layer's MLP, for a subclass whose MLP differs (a mixture of experts); None: the
        dense SwiGLU MLP in every layer."""
        return None

    def checkpoint_target(self, name: str) -> tuple[str, Any]:
        """(parameter name, shard id) a checkpoint tensor loads into; the name comes back unchanged
        for a tensor that is not ours (the core reports it among the unused). Here q/k/v go to the
        fused ``qkv_proj`` and gate/up to ``gate_up_proj``; a subclass with other tensors maps
        those first."""
        for part, (fused, fused_shard) in _FUSED.items():
            if part in name:
                return name.replace(part, fused), fused_shard
        return name, None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.logits_from(self.hidden_states(batch), batch)

    # The two halves of forward, for the piecewise CUDA graphs of prefill steps
    # (runner/piecewise.py): the token-major body is captured, padded to a token count; the head
    # depends on how many sequences the batch has and runs eagerly.
    def hidden_states(self, batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """Token-major tensors (one row per new token) the logits are computed from."""
        return self.model(batch)

    def logits_from(self, states: tuple[torch.Tensor, ...], batch: ForwardBatch) -> torch.Tensor:
        """The logits of ``batch.logits_indices`` from :meth:`hidden_states`' rows."""
        out, residual = states
        rows = batch.logits_indices
        # index_select, not out[rows]: on a CPU, advanced indexing opens a parallel region even
        # for one row (see the torch attention backend's _gather)
        hidden, _ = self.model.norm(out.index_select(0, rows), residual.index_select(0, rows))
        return self.lm_head(hidden)  # in the model's dtype: the sampler upcasts as it reads

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))  # tied lm_head.weight is listed too
        used: set[str] = set()
        loaded: set[tuple[int, Any]] = set()
        for name, tensor in weights:
            target, shard_id = self.checkpoint_target(name)
            if name == "lm_head.weight" and self.tie_word_embeddings:
                # config.json ties the head to the embeddings: a checkpoint's own lm_head.weight
                # would overwrite the shared matrix or not depending on file order. Skipped, as
                # vLLM does; the core reports it among the unused tensors.
                continue
            param = params.get(target)
            if param is None:
                continue  # not ours (e.g. rotary inv_freq); the core reports unused names
            if param.is_floating_point() and not tensor.is_floating_point():
                # (copy_ would cast the integers to floats without a word: another model)
                raise ValueError(
                    f"dtype {str(tensor.dtype).removeprefix('torch.')} for a floating-point "
                    "parameter: integer and bool tensors are not cast to floats"
                )
            # copy_ in the loaders moves only this rank's slice to the parameter's device and dtype;
            # a loader that filled several shards from one tensor returns their ids
            filled = param.weight_loader(param, tensor, shard_id)  # type: ignore[attr-defined]
            used.add(name)
            loaded.update((id(param), sid) for sid in (filled if filled is not None else [shard_id]))
        for name, param in params.items():
            missing = [sid for sid in getattr(param, "shard_ids", (None,)) if (id(param), sid) not in loaded]
            if missing:
                parts = "" if missing == [None] else f" (parts {missing} missing)"
                raise ValueError(
                    f"model parameter {name!r} was never loaded{parts}: the checkpoint has no tensor for it"
                )
        return used


def unsupported_for(
    model_cls: type[DecoderForCausalLM], hf: dict[str, Any], context_len: int | None
) -> str | None:
    """``model_cls.unsupported_setting(hf, context_len)``; a subclass whose override predates
    ``context_len`` (a plugin's) is asked without it, so judged for the config's longest context."""
    try:
        takes_context = "context_len" in inspect.signature(model_cls.unsupported_setting).parameters
    except (TypeError, ValueError):
        takes_context = False
    if takes_context:
        return model_cls.unsupported_setting(hf, context_len)
    return model_cls.unsupported_setting(hf)


def _unsupported_activation(hf: dict[str, Any]) -> str | None:
    act = hf.get("hidden_act", "silu")
    return None if act == "silu" else f"hidden_act {act!r} is not supported (silu is)"


def _unsupported_sliding_window(hf: dict[str, Any], when_set: bool) -> str | None:
    """A sliding window that applies (``use_sliding_window``, or ``sliding_window`` alone with
    ``when_set``) but is no window: not a positive whole number of tokens, or a ``layer_types``
    that does not name each layer's attention."""
    if hf.get("use_sliding_window") or (when_set and hf.get("sliding_window") is not None):
        return _window_problem(hf)
    return None


def _window_problem(hf: dict[str, Any]) -> str | None:
    window, types = hf.get("sliding_window"), hf.get("layer_types")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        named = (
            f"use_sliding_window {json.dumps(hf['use_sliding_window'])} ("
            if hf.get("use_sliding_window")
            else ""
        )
        return (
            f"{named}sliding_window {json.dumps(window)}{')' if named else ''} is not supported: the "
            "window must be a positive number of tokens"
        )
    if types is not None:
        layers = hf.get("num_hidden_layers")
        kinds = {"sliding_attention", "full_attention"}
        if not isinstance(types, list) or len(types) != layers or not set(types) <= kinds:
            return (
                f"layer_types {json.dumps(types)[:80]} is not supported: one of "
                f'"sliding_attention" or "full_attention" for each of the {layers} layers'
            )
    elif hf.get("use_sliding_window") and "max_window_layers" in hf:
        # (sliding_window_layers takes it for the first sliding layer; transformers validates it
        # for Qwen2 and Qwen3 only: under a Llama config "x" or null was int()'s ValueError or
        # TypeError traceback from the model's construction, and 1.5 silently layer 1, not 2)
        first = hf["max_window_layers"]
        if isinstance(first, bool) or not isinstance(first, int):
            return (
                f"max_window_layers {json.dumps(first)[:80]} is not supported: the first layer with "
                "the sliding window must be a whole number (or leave the key out: 28)"
            )
    return None


def _unsupported_rope(hf: dict[str, Any]) -> str | None:
    """rotary.py's refusals (its rope types and rules), with the config.json key they come from;
    a top-level partial_rotary_factor (Phi, GLM configs), which rotary.py does not read, too."""
    for where, params in (
        ("", hf),
        *((f"{key}.", hf[key]) for key in _ROPE_KEYS if isinstance(hf.get(key), dict)),
    ):
        factor = params.get("partial_rotary_factor")
        if factor is not None and factor != 1.0:
            return f"{where}partial_rotary_factor {factor!r} is not supported (whole heads are rotated)"
    try:
        get_rope(hf, _head_dim(hf))
    except NotImplementedError as exc:
        key = next((key for key in _ROPE_KEYS if hf.get(key)), "rope_scaling")
        return f"{key}: {exc}"
    except (KeyError, TypeError, ValueError, ArithmeticError):
        return None  # malformed rather than unsupported: the constructor says what is missing
    return None


#: where config.json keeps the rope settings (transformers 5, older)
_ROPE_KEYS = ("rope_parameters", "rope_scaling")


def _bias_in(hf: dict[str, Any]) -> bool:
    """Whether the config gives o_proj or down_proj a bias (``attention_bias``, ``mlp_bias``)."""
    return bool(hf.get("attention_bias", False)) or bool(hf.get("mlp_bias", False))


def _head_dim(hf: dict[str, Any]) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
