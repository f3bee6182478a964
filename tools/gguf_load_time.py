"""Seconds to dequantize GGUF weights on the CPU: a model's whole ``GGUFFormat.weights(dtype)``
(the default model unless a path is given), or with ``--synthetic TYPE`` one large tensor of that
block type (random blocks, written to a temporary GGUF file; 4096 x 14336, an 8B model's MLP
matrix, unless ``--shape``) through ``dequantize_tensor`` (``--numpy``: through gguf's NumPy
``dequantize``, the baseline); each with the GB/s of the file's bytes. The bounds beside it:
reading those bytes from the (cached) file, and copying the float32 result once. Types: Q8_0,
Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K.

    python3 tools/gguf_load_time.py [PATH] [--dtype bfloat16] [--repeat 3]
    python3 tools/gguf_load_time.py --synthetic Q4_K [--shape 14336x4096] [--numpy]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _plugins_on_path() -> None:
    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root), *(str(p) for p in sorted(root.glob("plugins/*/*")) if p.is_dir())]


def _timed(label: str, nbytes: int, run) -> None:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.3f} s, {nbytes / seconds / 1e9:.2f} GB/s of file bytes", flush=True)


def _model(path: Path, dtype: torch.dtype, repeat: int) -> None:
    from minisgl_plugin_gguf.format import GGUFFormat

    source = GGUFFormat(path)
    nbytes = source.file.stat().st_size
    for i in range(repeat):
        _timed(f"weights({dtype}) #{i + 1}", nbytes, lambda: sum(w.numel() for _, w in source.weights(dtype)))
    _timed("read the file", nbytes, lambda: source.file.read_bytes())


#: where each block type ``--synthetic`` knows keeps its float16 scale ``d`` (and minimum or
#: ``dmin``), in bytes from the block's start; the other bytes are random, which is a valid block of
#: each (every bit pattern decodes). gguf can only read K-quants, so the blocks are written raw.
_FLOAT16_SCALES = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
}  # fmt: skip


def _synthetic(type_name: str, shape: tuple[int, int], dtype: torch.dtype, repeat: int, numpy: bool) -> None:
    import gguf
    from minisgl_plugin_gguf.dequantize import _BLOCK_FORMATS, dequantize_tensor
    from minisgl_plugin_gguf.format import _quant_sizes
    from minisgl_plugin_gguf.header import read_header

    if numpy:  # the baseline: the path of the types not dequantized in PyTorch
        _BLOCK_FORMATS.pop(type_name, None)

    qtype = gguf.GGMLQuantizationType[type_name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    blocks = np.random.default_rng(0).integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
    scales = np.full(len(blocks), 0.002, dtype=np.float16).view(np.uint8).reshape(-1, 2)
    for at in _FLOAT16_SCALES[type_name]:  # finite weights: the float16 scales (and minimums) set
        blocks[:, at : at + 2] = scales
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "synthetic.gguf"
        writer = gguf.GGUFWriter(str(file), "llama")
        writer.add_tensor("w", blocks.reshape(rows, -1), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        header = read_header(file, _quant_sizes())
        tensor = header.tensors[0]
        print(f"{type_name} {rows}x{cols}: {tensor.n_bytes / 1e6:.0f} MB in the file", flush=True)
        for i in range(repeat):
            _timed(
                f"dequantize_tensor({dtype}) #{i + 1}",
                tensor.n_bytes,
                lambda: dequantize_tensor(header, tensor, dtype),
            )
        _timed("read the file", tensor.n_bytes, lambda: file.read_bytes())
    result = torch.empty(rows, cols)
    _timed("copy the float32 result once", tensor.n_bytes, lambda: result.clone())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "path", nargs="?", type=Path, default=Path.home() / ".cache/minisgl/SmolLM2-135M-Instruct"
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--synthetic", metavar="TYPE", choices=_FLOAT16_SCALES, help=", ".join(_FLOAT16_SCALES)
    )
    parser.add_argument("--shape", default="14336x4096", help="rows x columns")
    parser.add_argument(
        "--numpy", action="store_true", help="with --synthetic: through gguf's NumPy dequantize"
    )
    args = parser.parse_args()
    _plugins_on_path()
    dtype = getattr(torch, args.dtype)
    if args.synthetic:
        rows, cols = (int(n) for n in args.shape.split("x"))
        _synthetic(args.synthetic, (rows, cols), dtype, args.repeat, args.numpy)
    else:
        _model(args.path, dtype, args.repeat)


if __name__ == "__main__":
    main()
