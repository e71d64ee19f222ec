"""Mimi (Kyutai): fixed-length graphs, and step graphs that stream both ways with explicit state
(and `--slots` copies of them for many streams at once).

Its modules by role (docs/architecture.md); `HELPERS` gives the role of those that are its own."""

HELPERS = {"transformer": "model"}  # its causal transformer with a ring cache, as moshi's
