"""The browser `codec-bench web` and the tests drive: Debian's Chromium through Playwright, never
a browser Playwright downloads. Its flags work as root and make no network noise
(the project's notes on Chromium)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("CODECPORT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage")
