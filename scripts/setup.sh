#!/usr/bin/env bash
# Create .venv (if missing) and install codecport with the extras given as $1 (e.g. "export,dev").
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-export}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
# torch first, pinned: 2.13.0 is the CPU build that development machines keep locally; an
# unpinned torch would pull a multi-GB CUDA build through the [export] extra.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[${extras}]"
# The official NeuCodec and XCodec2 for the parity tests (scripts/official-neucodec.txt says why --no-deps).
if [[ ",${extras}," == *",dev,"* ]]; then
  .venv/bin/python -m pip install -q --no-deps -r scripts/official-neucodec.txt
fi
