"""codecport's version: one place, read by pyproject.toml, imported by the package and by what writes
it into files (web/package.json and codecport.mjs carry it too: tests/test_web.py holds them to it)."""

__version__ = "0.3.0"
