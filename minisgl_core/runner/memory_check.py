"""What the KV pool and the request tables ask of the device, checked before they are allocated:
a ``num_kv_tokens`` or ``max_running_requests`` past the device's memory is one error naming the
setting and the bytes, not an allocator's traceback from deep in start-up."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from minisgl_core.config import ConfigError


class MemoryAsk(NamedTuple):
    """One allocation a setting makes at start-up."""

    #: the setting and what it sizes, by field names: "num_kv_tokens=65536 (the KV pool)"
    what: str
    bytes: int
    #: the settings to lower, as ConfigError names them
    fields: tuple[str, ...]


def free_bytes(device: torch.device) -> int | None:
    """The memory a new allocation on ``device`` can take now; None where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            info = {key: int(rest.split()[0]) * 1024 for key, _, rest in (line.partition(":") for line in f)}
        # MemAvailable counts the page cache the kernel would give back; swap works too, slowly
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_fits(asks: list[MemoryAsk], device: torch.device, free: int | None) -> None:
    """Refuse ``asks`` that together need more than the ``free`` bytes of ``device``. The pool is
    zero-filled, so every byte asked for is touched at start-up (no lazy overcommit to lean on)."""
    if free is None or sum(ask.bytes for ask in asks) <= free:
        return
    # the one setting past the device on its own, else all of them together
    over = [ask for ask in asks if ask.bytes > free] or asks
    raise _too_large(over, f"more than the {_size(free)} free on {device}")


@contextmanager
def refusing_failed_allocation(ask: MemoryAsk, device: torch.device) -> Iterator[None]:
    """The same error where allocating ``ask`` fails after all (memory taken meanwhile, a
    device that could not say what it had free)."""
    try:
        yield
    except RuntimeError as exc:
        # torch.OutOfMemoryError on CUDA; on the CPU "can't allocate memory", or a size past
        # 2**63 bytes: "Storage size calculation overflowed"
        reason = str(exc).strip()
        if not isinstance(exc, torch.OutOfMemoryError) and not ("allocate" in reason or "overflow" in reason):
            raise
        reason = reason.splitlines()[0][:200] if reason else type(exc).__name__
        raise _too_large([ask], f"and allocating it on {device} failed ({reason})") from exc


def _too_large(asks: list[MemoryAsk], why: str) -> ConfigError:
    needs = " and ".join(f"{ask.what} asks for {_size(ask.bytes)}" for ask in asks)
    fields = list(dict.fromkeys(field for ask in asks for field in ask.fields))
    lower = " or ".join([", ".join(fields[:-1]), fields[-1]] if len(fields) > 1 else fields)
    return ConfigError(f"{needs}, {why}: lower {lower}", *fields)


def _size(size: int) -> str:
    """``size`` in bytes exactly, and in the largest binary unit it fills."""
    scaled, unit = float(size), ""
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if scaled < 1024:
            break
        scaled, unit = scaled / 1024, larger
    return f"{size} bytes ({scaled:.1f} {unit})" if unit else f"{size} bytes"
