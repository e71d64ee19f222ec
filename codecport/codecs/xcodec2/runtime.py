"""XCodec2 on ONNX Runtime: NeuCodec's runtime (codecs/neucodec/runtime.py) on an XCodec2 export, 16 kHz
in and out, one FSQ codebook of 65 536 codes at 50 Hz.

The official `encode_code` pads the clip to the next 320 samples (a whole frame more when already
there) and gives a code for every padded frame: `n // 320 + 1` codes for `n` samples, which
`decode_code` turns into 320 samples each. The graphs' metadata (`fbank_pad`, `acoustic_extra`)
tells the shared runtime how XCodec2 lines its two encoder paths up.
"""

from __future__ import annotations

from ..neucodec.runtime import NeuCodecCodec


class XCodec2Codec(NeuCodecCodec):
    """The graphs of one `codec-export xcodec2` folder, opened lazily on one provider."""

    name, label = "xcodec2", "XCodec2"
