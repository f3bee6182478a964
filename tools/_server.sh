#!/usr/bin/env bash
# Sourced by the tools/ scripts that start `minisgl serve` on the GPU machine (or the CPU):
#   need_server_deps [PY]            exit 2 at once, naming the fix, when PY (default python3)
#                                    cannot import the server's packages (the call carried no
#                                    wheels, or .whl/prelude.sh was not sourced)
#   wait_server URL SECONDS PID LOG  0 once URL answers; 1 as soon as PID exits or SECONDS pass,
#                                    after printing LOG's last lines (a server that died at start
#                                    costs seconds, not the whole wait)

need_server_deps() {
  "${1:-python3}" -c 'import fastapi, uvicorn, zmq' 2>/dev/null && return 0
  echo "$(basename "$0"): ${1:-python3} cannot import fastapi, uvicorn and zmq: carry the wheels" \
    "(.dev/w2 or .whl) and run 'source .whl/prelude.sh' first (../shared/device/README.md)" >&2
  exit 2
}

wait_server() {
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt "$end" ]; do
    if ! kill -0 "$3" 2>/dev/null; then
      echo "$(basename "$0"): the server exited before it answered $1; $4 ends:" >&2
      tail -n 8 "$4" >&2
      return 1
    fi
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "$(basename "$0"): no answer from $1 in $2 s; $4 ends:" >&2
  tail -n 8 "$4" >&2
  return 1
}
