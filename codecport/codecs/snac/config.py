"""SNAC's config and its released presets, torch-free (the CLI and the registry read them).

A SNAC `config.json` is `SNAC.__init__`'s keyword arguments, verbatim. Every config is bounded
when it is made, and what the geometry needs (strides that nest, windows that tile) is checked
before a layer is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ConfigError
from ...models.geometry import Conv, UpConv, Window, decoder_margin, encoder_margin, residual_units, strided
from ...models.limits import MAX_PARAMS, check_int, check_ints


@dataclass(frozen=True)
class SnacConfig:
    sampling_rate: int = 44100  # Hz, mono
    encoder_dim: int = 64  # channels after the stem conv; doubled by every encoder block
    encoder_rates: tuple[int, ...] = (3, 3, 7, 7)  # encoder strides; their product is the hop
    latent_dim: int | None = None  # None: encoder_dim * 2**len(encoder_rates), as the official
    decoder_dim: int = 1536  # channels after the decoder stem; halved by every decoder block
    decoder_rates: tuple[int, ...] = (7, 7, 3, 3)
    attn_window_size: int | None = 32  # local attention window in latent frames (None: none)
    codebook_size: int = 4096
    codebook_dim: int = 8
    vq_strides: tuple[int, ...] = (8, 4, 2, 1)  # latent frames per code of each level, coarse first
    noise: bool = True  # the decoder's noise blocks
    depthwise: bool = True  # grouped (depthwise) convs in the residual units

    def __post_init__(self):
        check_int("sampling_rate", self.sampling_rate, 1_000, 1_000_000)
        check_int("encoder_dim", self.encoder_dim, 1, 4096)
        check_ints("encoder_rates", self.encoder_rates, 1, 64, 8)
        check_ints("decoder_rates", self.decoder_rates, 1, 64, 8)
        check_int("decoder_dim", self.decoder_dim, 2 ** len(self.decoder_rates), 16384)
        if self.attn_window_size is not None:
            check_int("attn_window_size", self.attn_window_size, 1, 4096)
        check_int("codebook_size", self.codebook_size, 2, 1 << 16)
        check_int("codebook_dim", self.codebook_dim, 1, 1024)
        check_ints("vq_strides", self.vq_strides, 1, 256, 16)
        for key in ("noise", "depthwise"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"config {key}={getattr(self, key)!r} must be true or false")
        enc_out = self.encoder_dim * 2 ** len(self.encoder_rates)
        if enc_out > 1 << 16:
            raise ConfigError(f"encoder_dim {self.encoder_dim} doubled {len(self.encoder_rates)} "
                              "times is past any SNAC model; is this config right?")
        if self.latent_dim is not None and self.latent_dim != enc_out:
            # The official encoder ends at encoder_dim * 2**blocks channels whatever latent_dim says:
            # another latent_dim builds a model whose encoder and quantizer do not fit together.
            raise ConfigError(f"config latent_dim={self.latent_dim!r} is not the encoder's width "
                              f"{enc_out}; SNAC cannot run such a model")
        if self.attn_window_size and (enc_out % 64 or self.decoder_dim % 64):
            raise ConfigError("local attention works on 64-channel heads: encoder and decoder "
                                  "widths must be multiples of 64")
        if any(self.vq_strides[0] % s for s in self.vq_strides):
            # Each level's codes must nest in the coarsest level's: that is what lets a whole
            # clip be cut into windows at coarse-frame boundaries.
            raise ConfigError(f"config vq_strides={list(self.vq_strides)}: every stride must divide "
                              "the first (coarsest) one")
        if self.approx_params() > MAX_PARAMS:
            raise ConfigError(f"the config describes a model of about {self.approx_params() / 1e9:.1f} G "
                              "parameters, far past any SNAC model; is this config right?")

    @property
    def sample_rate(self) -> int:
        return self.sampling_rate

    @property
    def latent(self) -> int:
        return self.encoder_dim * 2 ** len(self.encoder_rates)

    @property
    def hop_length(self) -> int:
        """Audio samples per latent (finest) frame."""
        return math.prod(self.encoder_rates)

    @property
    def unit_frames(self) -> int:
        """Latent frames of one coarse code frame and whole attention windows: the official
        `preprocess` pads audio to a multiple of this many frames, and windows cut there."""
        return math.lcm(self.vq_strides[0], self.attn_window_size or 1)

    @property
    def n_codebooks(self) -> int:
        return len(self.vq_strides)

    def encoder_layers(self) -> list:
        """The encoder's convs and attention, in order (see geometry.py)."""
        layers = [Conv(7, pad=3)]
        for s in self.encoder_rates:
            layers += [*residual_units(), strided(s)]
        if self.attn_window_size:
            layers.append(Window(self.attn_window_size))
        return [*layers, Conv(7, pad=3)]

    def decoder_layers(self) -> list:
        layers = [Conv(7, pad=3), Conv(1)] if self.depthwise else [Conv(7, pad=3)]
        if self.attn_window_size:
            layers.append(Window(self.attn_window_size))
        for s in self.decoder_rates:
            layers += [UpConv(s, math.ceil(s / 2)), *residual_units()]
        return [*layers, Conv(7, pad=3)]

    def margins(self) -> tuple[int, int]:
        """(encoder, decoder) latent frames a window keeps clear of its edges for its outputs to
        be those of the whole clip: its receptive field, rounded up to whole coarse frames."""
        hop, unit = self.hop_length, self.unit_frames
        return (encoder_margin(self.encoder_layers(), hop, unit),
                decoder_margin(self.decoder_layers(), math.prod(self.decoder_rates), unit))

    def approx_params(self) -> int:
        """Parameters of the convs, attention and codebooks, within a few percent."""
        n, d = 7 * self.encoder_dim, self.encoder_dim
        for s in self.encoder_rates:
            per = 7 if self.depthwise else 7 * d
            n += 3 * (per * d + d * d) + d * 2 * d * 2 * s
            d *= 2
        c = self.decoder_dim
        n += 7 * d + d * c + (4 * (d * d + c * c) if self.attn_window_size else 0)
        for s in self.decoder_rates:
            o = c // 2
            per = 7 if self.depthwise else 7 * o
            n += c * o * 2 * s + 3 * (per * o + o * o) + o * o
            c = o
        return n + len(self.vq_strides) * (2 * d + self.codebook_size) * self.codebook_dim

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> SnacConfig:
        """Config from a `config.json` (`SNAC.__init__`'s kwargs); an unknown key is refused,
        since it would be a model this reference does not build."""
        if not isinstance(kwargs, dict):
            raise ConfigError("the config is not a JSON object of SNAC settings")
        unknown = sorted(set(kwargs) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"config key {unknown[0]!r} is not one of SNAC's; is this a SNAC config.json?")
        try:
            out = {}
            for key, value in kwargs.items():
                if key in ("encoder_rates", "decoder_rates", "vq_strides"):
                    if not isinstance(value, (list, tuple)):
                        raise ConfigError(f"config {key}={value!r} must be a list")
                    value = tuple(value)
                out[key] = value
            return cls(**out)
        except TypeError as e:
            raise ConfigError(f"the config is not SNAC's ({e})") from e

    def to_kwargs(self) -> dict:
        """The official `config.json` spelling of this config."""
        return {"sampling_rate": self.sampling_rate, "encoder_dim": self.encoder_dim,
                "encoder_rates": list(self.encoder_rates), "latent_dim": self.latent_dim,
                "decoder_dim": self.decoder_dim, "decoder_rates": list(self.decoder_rates),
                "attn_window_size": self.attn_window_size, "codebook_size": self.codebook_size,
                "codebook_dim": self.codebook_dim, "vq_strides": list(self.vq_strides),
                "noise": self.noise, "depthwise": self.depthwise}


CONFIG = SnacConfig
# Released weights on Hugging Face: name -> repo (each holds config.json and pytorch_model.bin).
RELEASES = {"24khz": "hubertsiuzdak/snac_24khz", "32khz": "hubertsiuzdak/snac_32khz",
            "44khz": "hubertsiuzdak/snac_44khz"}
WEIGHTS_FILE, CONFIG_FILE = "pytorch_model.bin", "config.json"
PRESETS: dict[str, SnacConfig] = {
    # Orpheus TTS's codec; the config is the one published with the weights.
    "24khz": SnacConfig(sampling_rate=24000, encoder_dim=48, encoder_rates=(2, 4, 8, 8), decoder_dim=1024,
                        decoder_rates=(8, 8, 4, 2), attn_window_size=None, codebook_size=4096,
                        codebook_dim=8, vq_strides=(4, 2, 1), noise=True, depthwise=True),
    # The music models. Their configs as published beside the weights, quoted in
    # hubertsiuzdak/snac#17 and hard-coded alike in an independent port (DillionLowry/NeuralCodecs,
    # SNACConfig.cs); their hop of 384 gives the frame rates of the model cards (83 and 115 Hz).
    "32khz": SnacConfig(sampling_rate=32000, encoder_dim=64, encoder_rates=(2, 3, 8, 8), decoder_dim=1536,
                        decoder_rates=(8, 8, 3, 2), attn_window_size=32, codebook_size=4096,
                        codebook_dim=8, vq_strides=(8, 4, 2, 1), noise=True, depthwise=True),
    "44khz": SnacConfig(sampling_rate=44100, encoder_dim=64, encoder_rates=(2, 3, 8, 8), decoder_dim=1536,
                        decoder_rates=(8, 8, 3, 2), attn_window_size=32, codebook_size=4096,
                        codebook_dim=8, vq_strides=(8, 4, 2, 1), noise=True, depthwise=True),
    # Not released: small enough for unit tests, with local attention and an odd stride.
    "tiny": SnacConfig(sampling_rate=16000, encoder_dim=16, encoder_rates=(2, 3), decoder_dim=128,
                       decoder_rates=(3, 2), attn_window_size=4, codebook_size=64, codebook_dim=4,
                       vq_strides=(4, 2, 1), noise=True, depthwise=True),
}
