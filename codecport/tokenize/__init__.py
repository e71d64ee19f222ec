"""`codec-run tokenize`, the corpus tokenizer: an application on top of the runtime (driver.py)."""

from .driver import ENGINES, Summary, tokenize

__all__ = ["ENGINES", "Summary", "tokenize"]
