#!/usr/bin/env bash
# What the browser tests and `codec-run web` need beyond Python: Debian's Chromium (apt; it
# brings SwiftShader for WebGPU) and onnxruntime-web from npm, pinned by package-lock.json.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v npm >/dev/null || need+=(nodejs npm)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi
# npm ci only when the lockfile changed since the last install (it empties node_modules first).
if ! cmp -s package-lock.json node_modules/.codecport-lock 2>/dev/null; then
  npm ci --no-audit --no-fund
  cp package-lock.json node_modules/.codecport-lock
fi
