#!/usr/bin/env bash
# Install codecport with the export, dev, bench, coreml, ray and serve extras and the browser's Chromium and
# onnxruntime-web, then run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export,dev,bench,coreml,ray,serve
bash scripts/setup_web.sh
# The tree's lint is part of the test command: a line ruff flags fails the run as a test would.
.venv/bin/ruff check codecport tests scripts
# Three processes, each taking whole test files (--dist loadfile): many tests wait on a process or
# a page (a worker, a Ray cluster, Chromium), so on the 2-core machine three keep both cores
# busier than two. The exports the files share are built once a run (tests/shared_exports.py).
# The longest files start first (tests/conftest.py); the 25 slowest tests are printed at the end:
# the next regression shows there.
# Nothing spins waiting for work: ONNX Runtime's threads (CODECPORT_ORT_SPIN) and torch's OpenMP
# threads (OMP_WAIT_POLICY) would spin in the time of the other two processes, on cores they share.
export CODECPORT_ORT_SPIN=0 OMP_WAIT_POLICY=PASSIVE
# Every process compiles codecport's modules once, not each time: where the machine sets
# PYTHONDONTWRITEBYTECODE, each of the suite's ~300 Python processes (the CLI's, the workers', Ray's)
# compiled what it imported anew, a tenth of a second or more each. (__pycache__ is ignored by git.)
unset PYTHONDONTWRITEBYTECODE
PYTEST=(.venv/bin/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25)
# Every server and cluster a test starts stays on loopback: the suite runs in a private network
# namespace whose one interface is loopback (Ray binds the machine's routable address otherwise,
# whatever it is told). Where that needs privileges this user lacks, the Ray tests are left out,
# saying so.
if unshare -n true 2>/dev/null; then
    exec unshare -n bash -c 'ip link set lo up && exec "$@"' bash "${PYTEST[@]}" "$@"
fi
echo "scripts/test.sh: no private network namespace here (unshare -n needs root); the Ray tests" \
     "(-m ray) are left out, as they would bind the machine's address" >&2
exec "${PYTEST[@]}" -m "not ray" "$@"
