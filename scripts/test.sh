#!/usr/bin/env bash
# Install codecport with the export, dev, bench, coreml and ray extras, then run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export,dev,bench,coreml,ray
exec .venv/bin/python -m pytest -q "$@"
