"""Run ``python3 -m minisgl_core ARGS`` with class attributes of the Triton decode backend set
(``asm_widen``, ``k_rows``, ...), to measure a kernel variant end to end before it becomes the
default. TP=1 only (the engine runs in this process).

    python3 tools/triton_variant_run.py asm_widen=1 k_rows=0 -- bench offline --model M --kv-cache-dtype fp8_e4m3
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if "--" not in sys.argv:
        raise SystemExit(__doc__)
    split = sys.argv.index("--")
    settings, args = sys.argv[1:split], sys.argv[split + 1 :]
    from minisgl_plugin_triton.backend import TritonDecodeBackend

    for setting in settings:
        name, _, value = setting.partition("=")
        current = getattr(TritonDecodeBackend, name)  # an unknown name fails here
        setattr(
            TritonDecodeBackend,
            name,
            type(current)(int(value)) if isinstance(current, bool) else type(current)(value),
        )
    print(f"triton decode variant: {' '.join(settings)}", file=sys.stderr)
    sys.argv = ["minisgl_core", *args]
    runpy.run_module("minisgl_core", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
