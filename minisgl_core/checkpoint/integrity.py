"""What a model directory's files promise each other, read without loading a tensor.

A weight file cut short (an interrupted copy or download) and a config.json that does not describe
the weights (edited, or another model's) show in the safetensors headers alone; the tokenizer
files parse in a fraction of a second. The launcher checks all three before any process starts
(:func:`check_model_files`, from path_check), so a damaged model is one line naming the file, not
a scheduler rank's traceback once the weights load. No torch here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minisgl_core.api.weights import layer_count_problem
from minisgl_core.checkpoint.formats import (
    TOKENIZER_FILES,
    ModelPathError,
    checkpoint_files,
    config_refusal,
    model_max_length_problem,
    tokenizer_message,
)
from minisgl_core.checkpoint.safetensors_header import FLOAT_DTYPES, INTEGER_DTYPES, TensorEntry, read_header
from minisgl_core.setting_names import Spelling, given

#: Architectures whose checkpoints use Hugging Face's Llama names and shapes (``model.layers.N.
#: self_attn.q_proj.weight``...), which config.json alone determines. Other architectures may
#: reuse a name with another meaning (per-layer sizes, packed quantized weights), so their shapes
#: are left to their model's loader.
LLAMA_LAYOUT = frozenset(
    {
        "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GraniteForCausalLM",
        "Olmo2ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
        # (the decoder's too, their fused or expert tensors named otherwise: no rule matches them;
        # their sizes were tracebacks from the model's construction, a probe's find)
        "Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
    }
)  # fmt: skip


#: Llama-layout architectures whose q_norm and k_norm span the whole q and k projections (OLMo 2),
#: not one head
WHOLE_QK_NORMS = frozenset({"Olmo2ForCausalLM"})


def read_headers(model_dir: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint in ``model_dir``, from the headers of its files."""
    tensors: dict[str, TensorEntry] = {}
    for path in checkpoint_files(model_dir):
        tensors.update(read_header(path))
    return tensors


#: config.json sizes the engine reads for every architecture (max_position_embeddings sizes the
#: request table: -5 failed to allocate it, 0 loaded a model that refused every prompt)
ENGINE_SIZES = ("vocab_size", "max_position_embeddings")
#: the sizes and constants the Llama layout's decoder (layers/decoder.py) builds from; another
#: architecture may give these names other meanings (per-layer lists), so its model checks them.
#: The experts' counts too (Qwen3-MoE's num_experts, Mixtral's and transformers 5's
#: num_local_experts, Qwen3-MoE's decoder_sparse_step): the plugins took int() of them, so "7" was
#: silently 7 experts and NaN or a list a PluginFailure from the model's construction
LAYOUT_SIZES = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "moe_intermediate_size", "num_experts_per_tok", "num_experts", "num_local_experts", "decoder_sparse_step",
)  # fmt: skip
#: float32's largest number: the rotary frequencies and the norms are computed in float32, where a
#: larger one (1e308) is infinite
FLOAT32_MAX = 3.4028234663852886e38
#: float32's smallest normal number: a positive scale below it is 0 there, or its inverse infinite
FLOAT32_TINY = 1.1754943508222875e-38


def _above_one(value: float) -> bool:
    return value > 1


def _below_one(value: float) -> bool:
    return 0 < value < 1


def _at_least_one(value: float) -> bool:
    return value >= 1


def _whole_and_positive(value: float) -> bool:
    return isinstance(value, int) and value > 0


def _scale(value: float) -> bool:
    return value >= FLOAT32_TINY


#: scales some architectures multiply or divide by (Gemma's, Granite's)
SCALES = (
    "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
    "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
)  # fmt: skip
#: the rotary base: each rotary frequency is a power of 1 / rope_theta, so at 1 or below they do
#: not fall from the first dimension to the last (1e-320 was an infinity, 0.5 a model that answered
#: nonsense); released models use 10,000 to about 1e9 (tests, 10)
THETA_RULE = (_above_one, "a number above 1 (the rotary base; models use 10000 to 1e9)")
#: a positive scale float32 holds: below its smallest normal number (1e-320) it is 0 there
SCALE_RULE = (_scale, "a positive number float32 holds (1.2e-38 to 3.4e38)")
#: what config.json's constants must be, each as (test of a finite number, what the error says);
#: the bounds are the arithmetic's, and every released model is well inside them
CONSTANT_RULES = {
    "rope_theta": THETA_RULE,
    "rope_local_base_freq": THETA_RULE,  # (Gemma 3's sliding layers' rope_theta)
    # added to the mean square under the root: 1e308 or 7 flattened every activation (models use
    # 1e-5 or 1e-6)
    "rms_norm_eps": (_below_one, "a number between 0 and 1 (the norm's epsilon; models use 1e-5 or 1e-6)"),
    # a rope scaling's: the positions are divided by its factor (transformers' rule: at least 1;
    # 0.5 sped every rotation up, 1e308 made each frequency 0 in float32, 1e-320 an infinity), and
    # llama3's context before the scaling is a count of tokens (0.5 loaded)
    "factor": (_at_least_one, "a number of at least 1 (the positions are divided by it)"),
    # (llama3's band edges: the context is divided by them; 1e-320 is 0 in float32)
    "low_freq_factor": SCALE_RULE,
    "high_freq_factor": SCALE_RULE,
    "original_max_position_embeddings": (_whole_and_positive, "a positive integer"),
    # the architectures' own scales: Gemma 2's and 3's softmax scale query_pre_attn_scalar ** -0.5
    # (0 was a ZeroDivisionError from the model's build, -1 a complex number that failed the first
    # decode step) and soft-caps (null: none), Granite's multipliers; 1e308, or 1e-320 (0 in
    # float32), loaded a model that answered token 0, or was blamed on "the checkpoint is corrupt"
    **dict.fromkeys(SCALES, SCALE_RULE),
}
LAYOUT_CONSTANTS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", *SCALES)


def check_config_values(config: dict[str, Any], source: str = "config.json") -> None:
    """A ValueError naming the first config.json value no model can be built from: architectures
    not a list of names, a size or count not a positive integer (a string, a bool, a float, zero or
    less: each was a torch error deep in the model's construction, or a model that built), a rope
    theta, norm epsilon or rope scaling number outside what its arithmetic allows
    (:data:`CONSTANT_RULES`). Keys left out (or null) are the model's to default or require."""
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(name, str) for name in archs)):
        # transformers declares list[str] and reads architectures[0]: a string was its first letter
        raise ValueError(
            f'{source}: architectures must be a list of names, e.g. ["LlamaForCausalLM"], got {_shown(archs)}'
        )
    _check_not_quantized(config, source)
    _check_one_rope(config, source)
    layout = bool(archs) and archs[0] in LLAMA_LAYOUT
    for key in ENGINE_SIZES + (LAYOUT_SIZES if layout else ()):
        if config.get(key) is not None and _config_int(config, key) is None:
            raise ValueError(f"{source}: {key} must be a positive integer, got {_shown(config[key])}")
    if not layout:
        return
    for key, value in _constants(config):
        test, words = CONSTANT_RULES[key.rpartition(".")[2]]
        if not (_finite_number(value) and test(value)):
            raise ValueError(f"{source}: {key} must be {words}, got {_shown(value)}")


def _constants(config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(the key as the error names it, its value) of each constant config.json gives: the top-level
    ones, and those of its rope settings (transformers 5 nests rope_theta in rope_parameters,
    Gemma 3 one set a layer type). A top-level one that is null is the model's to default, but for
    a rope_theta no rope setting gives (the rotary's TypeError; and the config classes' defaults
    differ, Llama's 10000, Mixtral's 1e6); one that a rope setting states as null is a number
    missing (a TypeError from the rotary's build)."""
    nested = []
    for nest in ("rope_parameters", "rope_scaling"):
        settings = config.get(nest)
        if isinstance(settings, dict):
            nested.append((nest, settings))
            nested += [
                (f"{nest}.{kind}", settings[kind])
                for kind in LAYER_KINDS
                if isinstance(settings.get(kind), dict)
            ]
    for key in LAYOUT_CONSTANTS:
        if config.get(key) is not None:
            yield key, config[key]
    if "rope_theta" in config and config["rope_theta"] is None:
        if not any(params.get("rope_theta") is not None for _, params in nested):
            yield "rope_theta", None
    for where, params in nested:
        for key in ("rope_theta", *ROPE_SCALING_NUMBERS):
            if key in params:
                yield f"{where}.{key}", params[key]


def _check_not_quantized(config: dict[str, Any], source: str) -> None:
    """A checkpoint stored quantized (``quantization_config``: fp8 with its scales, GPTQ, AWQ...)
    is refused: its integers or float8 values were cast to floats without their scales (a model
    that answered nonsense) or its packed tensors were "never loaded"."""
    quantized = config.get("quantization_config")
    if quantized is None:
        return
    method = quantized.get("quant_method") if isinstance(quantized, dict) else None
    raise ValueError(
        f"{source}: the weights are stored quantized (quantization_config"
        f"{f', quant_method {_shown(method)}' if method is not None else ''}), which minisgl does not "
        "load; give the model's unquantized checkpoint (--quantization fp8, int8 or int4 quantizes "
        "it at load)"
    )


def _rope_settings(params: dict[str, Any]) -> dict[str, Any]:
    settings = dict(params)
    if "type" in settings:  # (the older spelling of rope_type)
        settings.setdefault("rope_type", settings.pop("type"))
    return settings


def _check_one_rope(config: dict[str, Any], source: str) -> None:
    """Both ``rope_scaling`` and ``rope_parameters`` given, saying different things: refused.
    transformers 5 takes ``rope_scaling`` whole and drops ``rope_parameters`` (its rope_theta
    too); rotary.py read ``rope_parameters``: a linear scaling beside it was silently ignored."""
    scaling, parameters = config.get("rope_scaling"), config.get("rope_parameters")
    if not (isinstance(scaling, dict) and scaling and isinstance(parameters, dict) and parameters):
        return
    a, b = _rope_settings(scaling), _rope_settings(parameters)
    # (a rope_theta one of them leaves out is no disagreement: the other gives it)
    keys = (a.keys() | b.keys()) - ({"rope_theta"} - (a.keys() & b.keys()))
    if any(a.get(key) != b.get(key) for key in keys):
        raise ValueError(
            f"{source}: rope_scaling {_shown(scaling)} and rope_parameters {_shown(parameters)} "
            "disagree (transformers 5 reads rope_scaling and drops rope_parameters); keep one of them"
        )


#: the numbers of a rope scaling (linear's factor, llama3's four)
ROPE_SCALING_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
#: the layer types Gemma 3's rope_parameters give settings for, one each
LAYER_KINDS = ("sliding_attention", "full_attention")


def _finite_number(value: Any) -> bool:
    """A number float32 holds (int or float, not a bool, NaN or an infinity)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= FLOAT32_MAX
    )


def _shown(value: Any) -> str:
    """``value`` as config.json writes it, cut to 80 characters."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _config_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def expected_shapes(config: dict[str, Any]) -> list[tuple[re.Pattern[str], tuple[int, ...], str]]:
    """(name pattern, shape, the config.json keys it follows from) of the Llama-layout tensors
    whose config keys are present."""
    return [(pattern, shape, keys) for pattern, shape, keys in _layout_rules(config) if None not in shape]  # type: ignore[misc]


def _layout_rules(config: dict[str, Any]) -> list[tuple[re.Pattern[str], tuple[int | None, ...], str]]:
    """Every Llama-layout tensor's (name pattern, shape, keys); a size config.json lacks is None."""
    hidden = _config_int(config, "hidden_size")
    vocab = _config_int(config, "vocab_size")
    heads = _config_int(config, "num_attention_heads")
    kv_heads = _config_int(config, "num_key_value_heads") or heads
    head_dim = _config_int(config, "head_dim") or (hidden // heads if hidden and heads else None)
    inter = _config_int(config, "intermediate_size")
    # (the experts' sizes: Mixtral's from intermediate_size and num_local_experts, Qwen3-MoE's from
    # moe_intermediate_size and num_experts, num_local_experts as transformers 5 writes it)
    moe_inter = _config_int(config, "moe_intermediate_size")
    experts = _config_int(config, "num_experts") or _config_int(config, "num_local_experts")
    q_rows = heads * head_dim if heads and head_dim else None
    kv_rows = kv_heads * head_dim if kv_heads and head_dim else None
    qkv_rows = q_rows + 2 * kv_rows if q_rows and kv_rows else None
    layer = r"model\.layers\.\d+\."
    archs = config.get("architectures") or [None]
    if archs[0] in WHOLE_QK_NORMS:
        qk_norms = [
            (layer + r"self_attn\.q_norm\.weight", (q_rows,), "num_attention_heads x head_dim"),
            (layer + r"self_attn\.k_norm\.weight", (kv_rows,), "num_key_value_heads x head_dim"),
        ]
    else:
        qk_norms = [(layer + r"self_attn\.[qk]_norm\.weight", (head_dim,), "head_dim")]
    rules = [
        (r"model\.embed_tokens\.weight", (vocab, hidden), "vocab_size, hidden_size"),
        (r"lm_head\.weight", (vocab, hidden), "vocab_size, hidden_size"),
        (r"model\.norm\.weight", (hidden,), "hidden_size"),
        (layer + r"(input|post_attention|pre_feedforward|post_feedforward)_layernorm\.weight", (hidden,), "hidden_size"),
        (layer + r"self_attn\.q_proj\.weight", (q_rows, hidden), "num_attention_heads x head_dim, hidden_size"),
        (layer + r"self_attn\.[kv]_proj\.weight", (kv_rows, hidden), "num_key_value_heads x head_dim, hidden_size"),
        (layer + r"self_attn\.q_proj\.bias", (q_rows,), "num_attention_heads x head_dim"),
        (layer + r"self_attn\.[kv]_proj\.bias", (kv_rows,), "num_key_value_heads x head_dim"),
        (layer + r"self_attn\.o_proj\.weight", (hidden, q_rows), "hidden_size, num_attention_heads x head_dim"),
        *qk_norms,
        # Phi-3's fused q/k/v and gate/up (a KV head count of 2**31 was the allocator's failure
        # for a 17 TB qkv_proj: the other shapes do not involve it)
        (layer + r"self_attn\.qkv_proj\.weight", (qkv_rows, hidden),
         "(num_attention_heads + 2 x num_key_value_heads) x head_dim, hidden_size"),
        (layer + r"mlp\.gate_up_proj\.weight", (2 * inter if inter else None, hidden), "2 x intermediate_size, hidden_size"),
        (layer + r"mlp\.(gate|up)_proj\.weight", (inter, hidden), "intermediate_size, hidden_size"),
        (layer + r"mlp\.down_proj\.weight", (hidden, inter), "hidden_size, intermediate_size"),
        # the experts, built from config.json before a weight is read: an intermediate size or
        # expert count of 2**31 was an allocation failure (smaller, all the memory) in their build
        (layer + r"block_sparse_moe\.experts\.\d+\.w[13]\.weight", (inter, hidden), "intermediate_size, hidden_size"),
        (layer + r"block_sparse_moe\.experts\.\d+\.w2\.weight", (hidden, inter), "hidden_size, intermediate_size"),
        (layer + r"block_sparse_moe\.gate\.weight", (_config_int(config, "num_local_experts"), hidden),
         "num_local_experts, hidden_size"),
        (layer + r"mlp\.experts\.\d+\.(gate|up)_proj\.weight", (moe_inter, hidden), "moe_intermediate_size, hidden_size"),
        (layer + r"mlp\.experts\.\d+\.down_proj\.weight", (hidden, moe_inter), "hidden_size, moe_intermediate_size"),
        (layer + r"mlp\.gate\.weight", (experts, hidden), "num_experts, hidden_size"),
    ]  # fmt: skip
    return [(re.compile(pattern), shape, keys) for pattern, shape, keys in rules]


def check_shapes(config: dict[str, Any], tensors: dict[str, TensorEntry]) -> None:
    """A ValueError naming the first tensor whose shape config.json contradicts, or whose dtype is
    an integer or bool one where the model holds floats, or the layers config.json counts that the
    weights do not have (or the other way round)."""
    archs = config.get("architectures") or []
    if not archs or archs[0] not in LLAMA_LAYOUT:
        return
    rules = expected_shapes(config)
    layout_names = [pattern for pattern, _, _ in _layout_rules(config)]
    for name, entry in sorted(tensors.items(), key=lambda item: _natural(item[0])):
        if entry.dtype in INTEGER_DTYPES and any(pattern.fullmatch(name) for pattern in layout_names):
            # the model holds these as floats: the loader cast the integers without a word (the
            # quantization methods quantize float checkpoints at load, whatever the run dtype)
            raise ValueError(
                f"weight {name} in {entry.file} has dtype {entry.dtype}; the model holds it as floating "
                "point (F32, F16, BF16...): integer and bool weights are not cast"
            )
        if entry.dtype not in FLOAT_DTYPES:  # packed quantized weights have shapes of their own
            continue
        for pattern, shape, keys in rules:
            if pattern.fullmatch(name):
                if entry.shape != shape:
                    raise ValueError(
                        f"weight {name} in {entry.file} has shape {list(entry.shape)}, config.json "
                        f"implies {list(shape)} ({keys}): config.json does not describe these weights"
                    )
                break
    layers = _config_int(config, "num_hidden_layers")
    found = {int(m.group(1)) for name in tensors if (m := re.match(r"model\.layers\.(\d+)\.", name))}
    if layers is None or not found:
        return
    problem = layer_count_problem(layers, found, key="num_hidden_layers", prefix="model.layers.")
    if problem:
        raise ValueError(f"config.json says {problem}: config.json does not describe these weights")


def _natural(name: str) -> list[Any]:
    """Sort key putting model.layers.2 before model.layers.10, so the first bad tensor is reported."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def check_tokenizer_files(model_dir: Path) -> None:
    """A ValueError unless ``model_dir`` has tokenizer files and the ones read as JSON parse
    (tokenizer.json through the tokenizers library, which is what loading it runs)."""
    if not any((model_dir / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(
            f"no tokenizer in {model_dir} (expected tokenizer.json, tokenizer.model or vocab.json next to "
            "config.json)"
        )
    try:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if (model_dir / name).is_file():
                try:
                    content = json.loads((model_dir / name).read_text(encoding="utf-8"))
                except ValueError as exc:
                    raise ValueError(f"{name} is not JSON ({exc})") from None
                # (tokenizer_config.json as a list was transformers' "'list' object has no
                # attribute 'get'"; transformers passes over a special_tokens_map.json that is one)
                if name == "tokenizer_config.json" and not isinstance(content, dict):
                    raise ValueError(f"{name} must hold a JSON object, got {type(content).__name__}")
                if name == "tokenizer_config.json":
                    problem = model_max_length_problem(content.get("model_max_length"))
                    if problem:
                        raise ValueError(f"{name}: {problem}")
        for name in TOKENIZER_FILES:  # (a directory there was transformers' "Couldn't instantiate
            # the backend tokenizer from one of:" after the weights had loaded)
            if (model_dir / name).exists() and not (model_dir / name).is_file():
                raise ValueError(f"{name} is not a file")
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            try:
                Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception
                raise ValueError(f"tokenizer.json: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(tokenizer_message(model_dir, exc)) from None


def check_transformers_reads(model_dir: Path, config: dict[str, Any]) -> None:
    """A ValueError where transformers refuses config.json (a field of the wrong type: a
    ``tie_word_embeddings`` of "false", a ``rope_scaling`` that is a string; a rope setting missing
    a key). Loading the tokenizer reads the config too: that failed after the weights had loaded,
    blaming the tokenizer files. An architecture transformers does not know is its plugin's."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's validators raise their own classes
        refusal = config_refusal(exc)
        field = re.match(r"Validation error for field '(\w+)'", str(exc))
        if refusal is None or (field is not None and field.group(1) in CHECKED_BY_THE_ENGINE):
            return
        from minisgl_core.layers.rotary import SUPPORTED_ROPE_TYPES  # (torch: not at import)

        if isinstance(exc, KeyError) and _rope_type(config) not in SUPPORTED_ROPE_TYPES:
            return  # (a key missing from a rope no model builds: the build check says it is unsupported)
        raise ValueError(f"config.json: {refusal}") from None


def _rope_type(config: dict[str, Any]) -> Any:
    from minisgl_core.layers.rotary import rope_parameters

    try:
        return rope_parameters(config)["rope_type"]
    except (TypeError, ValueError, AttributeError):
        return None


#: config.json fields the engine checks itself, naming the file and the fix in its own words
#: (generation_defaults.end_of_sequence: "eos_token_id must be a token id ...; remove the key")
CHECKED_BY_THE_ENGINE = frozenset({"eos_token_id"})


def check_model_files(model: str | Path, spelling: Spelling = "flag") -> None:
    """Raise ModelPathError (one line, naming the file) when a safetensors model directory's
    config.json holds a value no model is built from, its weights are cut short or corrupt or
    disagree with config.json, or its tokenizer does not load."""
    path = Path(model)
    try:
        config = json.loads((path / "config.json").read_text())
        check_config_values(config)
        check_shapes(config, read_headers(path))
        # (after the weights' checks: theirs name the tensor where both would refuse)
        check_transformers_reads(path, config)
        check_tokenizer_files(path)
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"{given('model', model, spelling)}: {exc}") from None
