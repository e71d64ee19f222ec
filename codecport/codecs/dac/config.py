"""DAC's config and its released presets, torch-free (the CLI and the registry read them).

Every config is bounded when it is made: a checkpoint whose `metadata.kwargs` ask for a model of
absurd size is refused before a single layer is built.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...errors import ConfigError
from ...models.geometry import (
    Conv,
    UpConv,
    decoder_margin,
    encoder_margin,
    residual_units,
    strided,
    unpadded_delay,
    unpadded_length,
)
from ...models.limits import MAX_PARAMS, check_int, check_ints

SNAKES = ("dac", "tsac")


@dataclass(frozen=True)
class DacConfig:
    sample_rate: int = 44100  # Hz
    encoder_dim: int = 64  # channels after the stem conv; doubled by every encoder block
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)  # encoder strides; their product is the hop
    latent_dim: int = 1024  # channels of the latent the quantizer sees
    decoder_dim: int = 1536  # channels after the decoder stem; halved by every decoder block
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)  # decoder upsampling strides
    n_codebooks: int = 9  # residual quantizer levels
    codebook_size: int = 1024  # entries per codebook (a .dac file stores codes as uint16)
    codebook_dim: int = 8  # dimension of the factorised code space
    # TSAC (Bellard's stereo DAC): audio channels one call of the graphs takes and gives, and the
    # decoder's Snake convention ("tsac": alpha indexed by the flat channel-major position).
    channels: int = 1
    snake: str = "dac"

    def __post_init__(self):
        check_int("sample_rate", self.sample_rate, 1_000, 1_000_000)
        check_int("encoder_dim", self.encoder_dim, 1, 4096)
        check_ints("encoder_rates", self.encoder_rates, 1, 64, 8)
        check_int("latent_dim", self.latent_dim, 1, 16384)
        check_ints("decoder_rates", self.decoder_rates, 1, 64, 8)
        check_int("decoder_dim", self.decoder_dim, 2 ** len(self.decoder_rates), 16384)
        check_int("n_codebooks", self.n_codebooks, 1, 256)
        check_int("codebook_size", self.codebook_size, 2, 1 << 16)
        check_int("codebook_dim", self.codebook_dim, 1, 1024)
        check_int("channels", self.channels, 1, 8)
        if self.snake not in SNAKES:
            raise ConfigError(f"snake must be one of {', '.join(SNAKES)}, got {self.snake!r}")
        if self.encoder_dim * 2 ** len(self.encoder_rates) > 1 << 16:
            raise ConfigError(f"encoder_dim {self.encoder_dim} doubled {len(self.encoder_rates)} times "
                              "is past any DAC model; is this config right?")
        if self.approx_params() > MAX_PARAMS:
            raise ConfigError(f"the config describes a model of about {self.approx_params() / 1e9:.1f} G "
                              "parameters, far past any DAC model; is this config right?")

    @property
    def hop_length(self) -> int:
        """Audio samples per code frame."""
        return math.prod(self.encoder_rates)

    def layers(self) -> tuple[list, list]:
        """(encoder, decoder) convs in the official module order, with the official padding
        (geometry.py's layers; the quantizer's 1x1 convs between them change no length)."""
        enc = [Conv(7, pad=3), *[c for s in self.encoder_rates for c in (*residual_units(), strided(s))],
               Conv(3, pad=1)]
        dec = [Conv(7, pad=3), *[c for s in self.decoder_rates
                                 for c in (UpConv(s, math.ceil(s / 2)), *residual_units())], Conv(7, pad=3)]
        return enc, dec

    def margins(self) -> tuple[int, int]:
        """(encoder, decoder) frames a window of the fixed graphs keeps clear of its edges for its
        codes and audio to be those of the whole clip (their receptive fields, geometry.py)."""
        enc, dec = self.layers()
        return (encoder_margin(enc, self.hop_length, 1),
                decoder_margin(dec, math.prod(self.decoder_rates), 1))

    def chunk_frames(self, window: int) -> int:
        """Frames the encoder gives for `window` samples with its padding off (a chunked window)."""
        return unpadded_length(self.layers()[0], window)

    def output_length(self, n: int) -> int:
        """Samples out of encode+decode with padding off (official `get_output_length`)."""
        return unpadded_length([c for layers in self.layers() for c in layers], n)

    def delay(self) -> int:
        """Zero padding put on both sides of the signal in chunked mode (official `get_delay`)."""
        return unpadded_delay([c for layers in self.layers() for c in layers])

    def approx_params(self) -> int:
        """Parameters of the convs and codebooks, within a few percent."""
        n, d = 7 * self.encoder_dim, self.encoder_dim
        for s in self.encoder_rates:
            n += 3 * 8 * d * d + d * 2 * d * 2 * s  # residual units at d, then the strided conv
            d *= 2
        n += 3 * d * self.latent_dim + 7 * self.latent_dim * self.decoder_dim
        c = self.decoder_dim
        for s in self.decoder_rates:
            n += c * (c // 2) * 2 * s + 3 * 8 * (c // 2) ** 2
            c //= 2
        return n + self.n_codebooks * (2 * self.latent_dim + self.codebook_size) * self.codebook_dim

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> DacConfig:
        """Config from the official checkpoint's `metadata.kwargs` (unknown keys ignored)."""
        try:
            enc_rates = tuple(int(r) for r in kwargs.get("encoder_rates", cls.encoder_rates))
            encoder_dim = int(kwargs.get("encoder_dim", cls.encoder_dim))
            latent = kwargs.get("latent_dim")
            codebook_dim = kwargs.get("codebook_dim", cls.codebook_dim)
            if isinstance(codebook_dim, (list, tuple)):
                if len(set(codebook_dim)) != 1:
                    raise ConfigError(f"per-codebook dimensions {codebook_dim} are not supported; "
                                      "all released DAC models use one dimension")
                codebook_dim = codebook_dim[0]
            return cls(
                sample_rate=int(kwargs.get("sample_rate", cls.sample_rate)),
                encoder_dim=encoder_dim,
                encoder_rates=enc_rates,
                latent_dim=int(latent) if latent is not None else encoder_dim * 2 ** min(len(enc_rates), 16),
                decoder_dim=int(kwargs.get("decoder_dim", cls.decoder_dim)),
                decoder_rates=tuple(int(r) for r in kwargs.get("decoder_rates", cls.decoder_rates)),
                n_codebooks=int(kwargs.get("n_codebooks", cls.n_codebooks)),
                codebook_size=int(kwargs.get("codebook_size", cls.codebook_size)),
                codebook_dim=int(codebook_dim),
                channels=int(kwargs.get("channels", cls.channels)),
                snake=str(kwargs.get("snake", cls.snake)),
            )
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"the config is not DAC's ({e})") from e

    def to_kwargs(self) -> dict:
        """The official `metadata.kwargs` spelling of this config."""
        d = dataclasses.asdict(self)
        d["encoder_rates"], d["decoder_rates"] = list(self.encoder_rates), list(self.decoder_rates)
        d["quantizer_dropout"] = False
        if (self.channels, self.snake) == (1, "dac"):  # the official DAC takes neither
            del d["channels"], d["snake"]
        return d


CONFIG = DacConfig
# Official release assets: (git tag, file). No checksums are published for them.
RELEASES = {
    "44khz": ("0.0.1", "weights.pth"),
    "24khz": ("0.0.4", "weights_24khz.pth"),
    "16khz": ("0.0.5", "weights_16khz.pth"),
    "44khz-16kbps": ("1.0.0", "weights_44khz_16kbps.pth"),
}
PRESETS: dict[str, DacConfig] = {
    "44khz": DacConfig(),
    "24khz": DacConfig(sample_rate=24000, encoder_rates=(2, 4, 5, 8), decoder_rates=(8, 5, 4, 2),
                       n_codebooks=32),
    "16khz": DacConfig(sample_rate=16000, encoder_rates=(2, 4, 5, 8), decoder_rates=(8, 5, 4, 2),
                       n_codebooks=12),
    "44khz-16kbps": DacConfig(latent_dim=128, n_codebooks=18),
    # Not a released model: small enough for unit tests, with an odd stride like 24/16 kHz.
    "tiny": DacConfig(sample_rate=16000, encoder_dim=4, encoder_rates=(2, 3), latent_dim=16,
                      decoder_dim=32, decoder_rates=(3, 2), n_codebooks=4, codebook_size=64,
                      codebook_dim=4),
    # Not a released model either: the tiny config with TSAC's stereo stem and decoder Snake.
    "tiny-tsac": DacConfig(sample_rate=16000, encoder_dim=4, encoder_rates=(2, 3), latent_dim=16,
                           decoder_dim=32, decoder_rates=(3, 2), n_codebooks=4, codebook_size=64,
                           codebook_dim=4, channels=2, snake="tsac"),
}
