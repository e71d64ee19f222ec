#!/usr/bin/env bash
# Install codecport with the export, dev, bench, coreml and ray extras and the browser's Chromium and
# onnxruntime-web, then run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export,dev,bench,coreml,ray
bash scripts/setup_web.sh
# Three processes, each taking whole test files (--dist loadfile): most tests wait on a subprocess
# or a page (an export, codec-run, a Ray cluster, Chromium), so on the 2-core machine three keep
# both cores busier than two (15:46 against 16:41 for the same suite, 2026-12-02).
exec .venv/bin/python -m pytest -q -n 3 --dist loadfile "$@"
