#!/usr/bin/env bash
# Offline demo: export DAC (random weights), encode and decode a generated clip, print the results.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh export
exec .venv/bin/codec-demo "$@"
