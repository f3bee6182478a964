#!/usr/bin/env bash
# PYTHON hook for shared/peer/run_peer.sh (used by tools/peer_compare.sh): every python3 call passes
# through unchanged, except bench_peer.py, whose place takes the build of the peer's FlashInfer
# JIT modules -- so they are built in exactly the environment (workspace, include flags) the
# peer's runs use, before any run is measured.
if [[ ${1:-} == */bench_peer.py ]]; then
  exec python3 - <<'PY'
import os, subprocess, sys, time
modules = {  # the FlashInfer modules mini-sglang uses and our engine does not build
    "sampling": "get_sampling_module()",
    "norm": "get_norm_module()",
    "rope": "get_rope_module()",
    "activation": "get_act_and_mul_module('silu')",
}
t0 = time.time()
procs = {name: subprocess.Popen([sys.executable, "-c", f"import flashinfer.{name} as m; m.{call}"],
                          env={**os.environ, "MAX_JOBS": "4"})
         for name, call in modules.items()}
failed = [name for name, p in procs.items() if p.wait() != 0]
print(f"[peer-jit] built {sorted(set(modules) - set(failed))} in {time.time() - t0:.0f} s; failed: {failed}")
sys.exit(1 if failed else 0)
PY
fi
exec python3 "$@"
