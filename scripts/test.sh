#!/usr/bin/env bash
# Install codecport with the export, dev, bench, coreml and ray extras and the browser's Chromium and
# onnxruntime-web, then run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export,dev,bench,coreml,ray
bash scripts/setup_web.sh
# Two processes, each taking whole test files (--dist loadfile): most tests wait on a subprocess
# (an export, codec-run, a Ray cluster), so two keep both cores busy; 10 min here, 14 in one.
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
