"""Servers on top of the runtime: `codec-run web`, the browser demo (web.py)."""
