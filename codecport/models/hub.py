"""Fetching released weights: Hugging Face files through huggingface_hub (its shared cache,
`HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_ENDPOINT` and revisions), anything else (GitHub release assets,
URLs) into `$XDG_CACHE_HOME/codecport` with a progress bar and an atomic rename."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from ..atomic import atomic_path
from ..errors import CheckpointError, DownloadError

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/codecport`, defaulting to `~/.cache/codecport`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "codecport"


def sha256_file(*paths: Path) -> str:
    """sha256 of the files' bytes, concatenated in the order given."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None) -> Path:
    """Fetch `url` to `dest` unless it is already cached; returns `dest`.

    `sha256` is checked only when the publisher gives one (DAC releases publish none).
    The bytes go to a temporary file beside `dest` and are renamed in place when complete,
    so an interrupted download never leaves a truncated checkpoint in the cache.
    """
    if dest.is_file():
        log.info("using cached %s", dest)
        return dest
    log.info("downloading %s -> %s", url, dest)
    try:
        with atomic_path(dest) as tmp:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name,
                          disable=None) as bar:
                    while block := resp.read(1 << 20):
                        out.write(block)
                        bar.update(len(block))
            size = tmp.stat().st_size
            if total is not None and size != total:
                raise DownloadError(f"download of {url} stopped at {size} of {total} bytes; "
                                    "run the command again")
            with open(tmp, "rb") as f:
                head = f.read(512).lstrip()
            if head.startswith(b"<"):  # a login or error page served with 200, kept as weights forever after
                raise DownloadError(f"{url} returned a web page, not weights; check the URL, or "
                                    "download the file yourself and pass it with --weights PATH")
            if sha256 is not None and sha256_file(tmp) != sha256:
                raise DownloadError(f"{url} does not match its published sha256; retry, or "
                                    "pass a local file with --weights")
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise DownloadError(f"cannot download {url}: {e}; check the network, or download it "
                            "yourself and pass the file with --weights PATH") from e
    return dest


def cached_url(url: str) -> Path:
    """Cache location for an arbitrary URL given with `--weights URL`."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = Path(urllib.request.url2pathname(url.rsplit("/", 1)[-1].split("?")[0])).name or "weights"
    return cache_dir() / "urls" / key / name



def hf_file(repo: str, filename: str, revision: str | None = None) -> Path:
    """`filename` of Hugging Face model repo `repo` at `revision` (default: main), from the
    shared Hugging Face cache or downloaded into it."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise DownloadError(f"downloading from Hugging Face needs huggingface_hub ({e}); "
                            "pip install 'codecport[export]'") from e
    log.info("fetching %s/%s (revision %s) through huggingface_hub", repo, filename, revision or "main")
    try:
        return Path(hf_hub_download(repo, filename, revision=revision))
    except Exception as e:  # huggingface_hub's errors have no common base beside network ones
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = ("HF_HUB_OFFLINE is set and the file is not in the cache; unset it or fetch the file "
                "once online" if offline else "check the network and HF_TOKEN, or download it yourself "
                "and pass the file with --weights PATH")
        raise DownloadError(f"cannot fetch {filename} from {repo} ({type(e).__name__}: {first}); "
                            f"{hint}") from e


def resolve(weights: str, releases: dict[str, Callable[[], Path]]) -> Path:
    """A released name (its fetcher is called), a URL, or a local path -> a local path,
    downloading into the cache when needed."""
    if weights in releases:
        return releases[weights]()
    if re.match(r"^https?://", weights):
        return download(weights, cached_url(weights))
    try:
        path = Path(weights).expanduser()
    except RuntimeError:  # ~name of no such user
        path = Path(weights)
    if not path.exists():
        raise CheckpointError(f"{weights}: no such file; pass a path, a URL, or one of "
                              f"{', '.join(releases)}")
    return path
