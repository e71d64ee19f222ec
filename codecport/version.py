"""codecport's version: one place, imported by the package and by what writes it into files."""

__version__ = "0.3.0"
