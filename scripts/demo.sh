#!/usr/bin/env bash
# Offline demo: export every registered codec (random weights), encode and decode a generated clip,
# tokenize a small folder, print the results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export
exec .venv/bin/codec-demo "$@"
