"""The residual vector quantizers in numpy (DAC's, Mimi's split one): the thin layer between the
ONNX graphs and codes, read from an export's `rvq.npz`."""

from __future__ import annotations

import logging
import math
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import AudioError, CodesError, ModelFileError
from .npyfile import read_npz

log = logging.getLogger(__name__)


_blas_lock = threading.Lock()
_blas_limited = []  # the limiter, once this process's BLAS is on one thread (never given back)


def blas_on_one_thread() -> None:
    """BLAS on one thread for the rest of this process, once, when the first numpy RVQ is made.

    The RVQ's matrices are small, and OpenBLAS's idle threads busy-wait after each call, stealing
    the cores ONNX Runtime runs on next: on the 2-core dev machine a Mimi streaming step took
    76 ms with them and 26 ms without. The limit is process-wide, and threadpoolctl lets only one
    thread change it (the first to try; the others' calls do nothing), so it is set once and
    kept, never taken and given back per call from whichever thread runs a codec.
    `CODECPORT_BLAS_THREADS=keep` leaves BLAS as it is, for a host whose own numpy work needs
    its threads more than the RVQ needs them gone.
    """
    if os.environ.get("CODECPORT_BLAS_THREADS") == "keep":
        return
    with _blas_lock:
        if not _blas_limited:
            from threadpoolctl import ThreadpoolController

            # numpy's own BLAS where it bundles one: torch's, in the same process, keeps its threads.
            # Where numpy links a shared BLAS (conda's MKL, the system's OpenBLAS), that one is
            # limited, for everything in the process that uses it.
            blas = ThreadpoolController().select(user_api="blas")
            home = Path(np.__file__).resolve().parent
            ours = [i["filepath"] for i in blas.info()
                    if any(Path(i["filepath"]).resolve().is_relative_to(d)
                           for d in (home, home.parent / "numpy.libs"))]
            _blas_limited.append((blas.select(filepath=ours) if ours else blas).limit(limits=1))
            log.info("BLAS limited to one thread in this process (codecport's RVQ; ONNX Runtime uses "
                     "the cores)")


def load_arrays(path: Path, meta: dict[str, str],
                shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays of an `rvq.npz`, each of the shape the graphs' metadata implies (`shapes`),
    finite, and written by the same export (its `export_id`); anything else is a `ModelFileError`.
    The archive is read with a limit from those shapes, so a bad file cannot inflate past them."""
    if not path.is_file():
        raise ModelFileError(f"{path}: missing; the graphs leave the quantizer out, so it must be "
                             "beside them (re-run codec-export)")
    limit = 2 * sum(8 * math.prod(s) for s in shapes.values()) + (1 << 20)
    z = read_npz(path, ModelFileError, max_bytes=limit)
    for name, shape in shapes.items():
        a = z.get(name)
        if a is None:
            raise ModelFileError(f"{path}: has no {name}; not a codecport RVQ file, re-run codec-export")
        if a.shape != shape:
            raise ModelFileError(f"{path}: {name} is {list(a.shape)}, the graphs' metadata says "
                                 f"{list(shape)}; it does not belong to these graphs, re-export the folder")
        if a.dtype.kind not in "fiu" or (a.dtype.kind == "f" and not np.isfinite(a).all()):
            raise ModelFileError(f"{path}: {name} is not finite numbers; re-run codec-export")
    written_by = z.get("export_id")
    if written_by is not None and str(written_by) != meta.get("export_id"):
        raise ModelFileError(f"{path} does not belong to these graphs (export_id {written_by} vs "
                             f"{meta.get('export_id')}); re-export the folder")
    return {name: z[name] for name in shapes}


def normalize(x: np.ndarray) -> np.ndarray:
    """`torch.nn.functional.normalize` over the last axis (eps 1e-12)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def check_n_codebooks(k: int | None, n: int) -> int:
    """`k` (None = all `n`) if it is a usable number of codebooks, else `CodesError`."""
    k = n if k is None else k
    if not 1 <= k <= n:
        raise CodesError(f"--codebooks must be between 1 and {n}, got {k}")
    return k


def check_latent(latent: np.ndarray) -> None:
    """A latent the quantizer can take: NaN or infinite values (an encoder that overflowed on
    the audio) would quantize to codes of nothing, so they are an `AudioError`."""
    if not np.isfinite(latent).all():
        raise AudioError("the encoder's output is not finite (it overflowed on this audio); pass "
                         "audio in [-1, 1]")


def check_code_values(codes: np.ndarray, codebook_size: int) -> None:
    """Integer codes within `[0, codebook_size)`, else `CodesError`."""
    if codes.dtype.kind not in "ui":
        raise CodesError(f"codes must be integers, got {codes.dtype}")
    if codes.size and (codes.min() < 0 or codes.max() >= codebook_size):
        raise CodesError(f"codes must be in [0, {codebook_size}), found [{codes.min()}, "
                         f"{codes.max()}]; were they made by another model?")


class FactorisedRvq:
    """DAC's factorised RVQ (SNAC's too, on several time scales: codecs/snac/rvq.py): K levels of
    (in_proj 1x1 conv, codebook, out_proj 1x1 conv), codes looked up by cosine similarity.

    Arrays: in_proj_weight `[K, D, L]`, in_proj_bias `[K, D]`, out_proj_weight `[K, L, D]`,
    out_proj_bias `[K, L]`, codebook `[K, N, D]` (L latent channels, D code dim, N entries).
    """

    def __init__(self, arrays: dict[str, np.ndarray]):
        blas_on_one_thread()
        self.in_w, self.in_b = arrays["in_proj_weight"], arrays["in_proj_bias"]
        self.out_w, self.out_b = arrays["out_proj_weight"], arrays["out_proj_bias"]
        self.codebook = arrays["codebook"]
        self.n_codebooks, self.codebook_size, self.codebook_dim = self.codebook.shape
        self.latent_dim = self.in_w.shape[2]
        self._unit_codebook = normalize(self.codebook)
        self._unit_sq = (self._unit_codebook ** 2).sum(-1)  # [K, N]

    @classmethod
    def load(cls, path: Path, g) -> FactorisedRvq:
        """From the `rvq.npz` beside graph `g`, checked against its metadata."""
        k, n, d, lat = (g.int(x) for x in ("n_codebooks", "codebook_size", "codebook_dim", "latent_dim"))
        shapes = {"in_proj_weight": (k, d, lat), "in_proj_bias": (k, d), "out_proj_weight": (k, lat, d),
                  "out_proj_bias": (k, lat), "codebook": (k, n, d)}
        return cls({name: a.astype(np.float32) for name, a in load_arrays(path, g.meta, shapes).items()})

    def arrays(self) -> dict[str, np.ndarray]:
        return {"in_proj_weight": self.in_w, "in_proj_bias": self.in_b,
                "out_proj_weight": self.out_w, "out_proj_bias": self.out_b,
                "codebook": self.codebook}

    def encode(self, latent: np.ndarray, n_codebooks: int | None = None) -> np.ndarray:
        """Codes `[K, T]` (int64) for a latent `[L, T]`, with the official distance formula."""
        k = check_n_codebooks(n_codebooks, self.n_codebooks)
        check_latent(latent)
        residual = latent.T.astype(np.float32)  # [T, L]
        codes = np.empty((k, residual.shape[0]), dtype=np.int64)
        for i in range(k):
            e = normalize(residual @ self.in_w[i].T + self.in_b[i])  # [T, D]
            dist = (e ** 2).sum(-1, keepdims=True) - 2 * e @ self._unit_codebook[i].T + self._unit_sq[i]
            codes[i] = np.argmax(-dist, axis=-1)
            residual = residual - self._project(i, codes[i])
        return codes

    def _project(self, i: int, codes: np.ndarray) -> np.ndarray:
        """out_proj of the raw (un-normalised) codebook rows: `[T, L]`."""
        return self.codebook[i][codes] @ self.out_w[i].T + self.out_b[i]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Latent `[L, T]` for codes `[K, T]` with K <= n_codebooks."""
        self.check_codes(codes)
        z = sum(self._project(i, codes[i]) for i in range(codes.shape[0]))
        return np.ascontiguousarray(z.T, dtype=np.float32)

    def check_codes(self, codes: np.ndarray) -> None:
        if codes.ndim != 2 or not 1 <= codes.shape[0] <= self.n_codebooks:
            raise CodesError(f"codes must be [codebooks<= {self.n_codebooks}, frames], got shape "
                             f"{list(codes.shape)}")
        check_code_values(codes, self.codebook_size)


class SplitRvq:
    """A split RVQ (Mimi's): a semantic and an acoustic RVQ of Euclidean codebooks quantize the
    same latent.

    Arrays: `*_in_proj` `[D, C]`, `*_out_proj` `[C, D]` (1x1 convs, no bias), codebook `[K, N, D]`
    (rows already divided by their cluster usage), n_semantic (levels of the semantic RVQ).
    """

    def __init__(self, arrays: dict[str, np.ndarray]):
        blas_on_one_thread()
        self.a = {k: v for k, v in arrays.items() if k != "codebook"}
        # Kept as [K, D, N]: a frame's distances are then a vector times a matrix read row by
        # row, which OpenBLAS runs twice as fast as against [N, D] when the codebooks are cold
        # in cache, as they are in a stream (8 codebooks, one frame: 1.4 -> 0.7 ms; four frames
        # 4.4 -> 2.3 ms; equal from 125 frames on). `codebook` is the [K, N, D] view of it.
        self._codebook_t = np.ascontiguousarray(arrays["codebook"].transpose(0, 2, 1))
        self.n_codebooks, self.codebook_size, self.codebook_dim = self.codebook.shape
        self.n_semantic = int(arrays["n_semantic"])
        self.latent_dim = arrays["semantic_in_proj"].shape[1]
        self._sq = (arrays["codebook"] ** 2).sum(-1)  # [K, N]

    @property
    def codebook(self) -> np.ndarray:
        """`[K, N, D]` (a view)."""
        return self._codebook_t.transpose(0, 2, 1)

    @classmethod
    def load(cls, path: Path, g) -> SplitRvq:
        """From the `rvq.npz` beside graph `g`, checked against its metadata."""
        k, n, d, c = (g.int(x) for x in ("n_codebooks", "codebook_size", "codebook_dim", "latent_dim"))
        shapes = {"semantic_in_proj": (d, c), "semantic_out_proj": (c, d), "acoustic_in_proj": (d, c),
                  "acoustic_out_proj": (c, d), "codebook": (k, n, d), "n_semantic": ()}
        arrays = load_arrays(path, g.meta, shapes)
        if int(arrays["n_semantic"]) != g.int("n_semantic"):
            raise ModelFileError(f"{path}: n_semantic is {int(arrays['n_semantic'])}, the graphs say "
                                 f"{g.int('n_semantic')}; re-export the folder")
        return cls({k: v if k == "n_semantic" else v.astype(np.float32) for k, v in arrays.items()})

    def arrays(self) -> dict[str, np.ndarray]:
        return {**self.a, "codebook": np.ascontiguousarray(self.codebook)}

    def _groups(self, k: int) -> list[tuple[str, range]]:
        s = self.n_semantic
        return [(g, r) for g, r in (("semantic", range(min(k, s))), ("acoustic", range(s, k))) if r]

    def encode(self, latent: np.ndarray, n_codebooks: int | None = None) -> np.ndarray:
        """Codes `[K, T]` (int64) for a latent `[C, T]`: Euclidean nearest row, as moshi."""
        k = check_n_codebooks(n_codebooks, self.n_codebooks)
        check_latent(latent)
        codes = np.empty((k, latent.shape[1]), dtype=np.int64)
        for group, levels in self._groups(k):
            r = (self.a[f"{group}_in_proj"] @ latent.astype(np.float32)).T  # [T, D]
            for i in levels:
                dist = (r ** 2).sum(-1, keepdims=True) - 2 * r @ self._codebook_t[i] + self._sq[i]
                codes[i] = dist.argmin(-1)
                r = r - self.codebook[i][codes[i]]
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Latent `[C, T]` for codes `[K, T]`, K <= n_codebooks."""
        if codes.ndim != 2 or not 1 <= codes.shape[0] <= self.n_codebooks:
            raise CodesError(f"codes must be [codebooks<={self.n_codebooks}, frames], got shape "
                             f"{list(codes.shape)}")
        check_code_values(codes, self.codebook_size)
        z = np.zeros((self.latent_dim, codes.shape[1]), np.float32)
        for group, levels in self._groups(codes.shape[0]):
            rows = sum(self.codebook[i][codes[i]] for i in levels)  # [T, D]
            z += self.a[f"{group}_out_proj"] @ rows.T
        return z
