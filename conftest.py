"""Settings for every test of the tree (the core's and the plugins'), read before any test module.

Under pytest-xdist (``make test`` runs two workers, one per core of a CI machine) each worker and
every process it starts (servers, CLI runs) uses one CPU thread: torch's default of one thread per
core would put four OpenMP threads on two cores, whose spin-waits stall each other."""

from __future__ import annotations

import os

if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
