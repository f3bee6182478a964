"""Seconds to dequantize GGUF weights on the CPU: a model's whole ``GGUFFormat.weights(dtype)``
(the default model unless a path is given), or with ``--synthetic TYPE`` one large tensor of that
block type (random blocks, written to a temporary GGUF file; 4096 x 14336, an 8B model's MLP
matrix, unless ``--shape``) through ``_dequantize``; each with the GB/s of the file's bytes. The
bounds beside it: reading those bytes from the (cached) file, and copying the float32 result once.

    python3 tools/gguf_load_time.py [PATH] [--dtype bfloat16] [--repeat 3]
    python3 tools/gguf_load_time.py --synthetic Q4_1 [--shape 14336x4096]
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


def _synthetic(type_name: str, shape: tuple[int, int], dtype: torch.dtype, repeat: int) -> None:
    import gguf
    from minisgl_plugin_gguf.format import _dequantize, _quant_sizes
    from minisgl_plugin_gguf.header import read_header

    qtype = gguf.GGMLQuantizationType[type_name]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    blocks = np.random.default_rng(0).integers(0, 256, (rows * cols // block, type_size), dtype=np.uint8)
    scales = np.full(len(blocks), 0.002, dtype=np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, :2] = scales  # finite weights (Q4_1's minimum is the next two bytes)
    if type_name == "Q4_1":
        blocks[:, 2:4] = scales
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
                f"_dequantize({dtype}) #{i + 1}", tensor.n_bytes, lambda: _dequantize(header, tensor, dtype)
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
    parser.add_argument("--synthetic", metavar="TYPE", help="Q8_0, Q4_0 or Q4_1")
    parser.add_argument("--shape", default="14336x4096", help="rows x columns")
    args = parser.parse_args()
    _plugins_on_path()
    dtype = getattr(torch, args.dtype)
    if args.synthetic:
        rows, cols = (int(n) for n in args.shape.split("x"))
        _synthetic(args.synthetic, (rows, cols), dtype, args.repeat)
    else:
        _model(args.path, dtype, args.repeat)


if __name__ == "__main__":
    main()
