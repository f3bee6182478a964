"""Launching a compiled Triton kernel without Triton's per-call binding (imported on first use:
it imports Triton).

``kernel[grid](*args)`` costs about 50 µs of host time on the GPU machine (binding the arguments,
specializing each one, hashing the key, looking up the device and stream), several times the
launch itself. Inside CUDA graphs that is paid once at capture; in prefill and mixed steps, which
run eagerly, it is paid for every kernel of every layer. :class:`DirectLaunch` lets Triton compile
and launch the first call of each specialization as usual, keeps the compiled kernel, and
launches later calls of the same specialization through ``CompiledKernel[grid](...)``.

The key must tell apart every call Triton would compile differently, or a kernel compiled for one
case runs on another: it holds each argument's kind and what Triton specializes on (a tensor's
dtype and 16-byte alignment; an integer's width, whether it is 1, whether it divides by 16), the
constexprs, ``num_warps`` and the device. A finer key than Triton's only costs a compile more.
Under the interpreter, off CUDA, or while Triton's launch hooks are set (a profiler), every call
goes through ``kernel[grid]``.
"""

from __future__ import annotations

from typing import Any

import torch
from triton import knobs

from minisgl_core import environment


def _spec(arg: Any) -> tuple:
    if isinstance(arg, torch.Tensor):
        return ("t", arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        return ("i", -(2**31) <= arg < 2**31, arg == 1, arg % 16 == 0)
    if isinstance(arg, float):
        return ("f",)
    if arg is None:
        return ("n",)
    raise TypeError(f"DirectLaunch: an argument of type {type(arg).__name__}")


class DirectLaunch:
    """``DirectLaunch(kernel)(grid, *args, num_warps=..., **constexprs)`` launches ``kernel`` as
    ``kernel[grid](*args, **constexprs, num_warps=...)`` does. ``args`` are the kernel's runtime
    parameters, in order; ``constexprs`` all of its constexpr parameters, which follow them."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.compiled: dict[tuple, Any] = {}

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int, **constexprs: Any) -> None:
        first = args[0]
        if (
            not first.is_cuda
            or environment.triton_interpreter()
            or knobs.runtime.launch_enter_hook is not None
            or knobs.runtime.launch_exit_hook is not None
        ):
            self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            return
        names = self.kernel.arg_names[len(args) :]
        if sorted(names) != sorted(constexprs):
            raise TypeError(
                f"DirectLaunch: {self.kernel.__name__} takes constexprs {names}, given {sorted(constexprs)}"
            )
        key = (first.device.index, num_warps, *(constexprs[n] for n in names), *map(_spec, args))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **constexprs, num_warps=num_warps)
            if compiled is not None:  # the compiled kernel Triton launched (None: nothing to keep)
                self.compiled[key] = compiled
            return
        grid3 = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        stream = torch.cuda.current_stream(first.device).cuda_stream
        compiled[grid3](*args, *(constexprs[n] for n in names), stream=stream)
