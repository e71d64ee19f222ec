"""XCodec2's presets, torch-free: NeuCodec's config (codecs/neucodec/config.py) at 16 kHz out.

XCodec2 (HKUST, the codec of the Llasa TTS models; pip `xcodec2`) is the model NeuCodec was
built from: the same semantic path (w2v-BERT 2.0's first 16 layers), acoustic encoder, FSQ of
4^8 codes at 50 Hz and Vocos decoder, with the same key names. It decodes to 16 kHz (320
samples a frame), and its fbank features read the padded clip with 160 zeros each side, so its
semantic path has as many frames as its acoustic one.
"""

from __future__ import annotations

from dataclasses import replace

from ..neucodec.config import PRESETS as NEUCODEC_PRESETS
from ..neucodec.config import NeuCodecConfig

CONFIG = NeuCodecConfig
ALIGNMENT = {"fbank_pad": 160, "acoustic_extra": 0}

PRESETS = {
    "xcodec2": NeuCodecConfig(sample_rate=16000, hop=320, **ALIGNMENT),
    # Not a released model: NeuCodec's tiny preset (8 kHz out) lined up as XCodec2 lines up.
    "tiny": replace(NEUCODEC_PRESETS["tiny"], **ALIGNMENT),
}

# Released names (each a preset) -> the Hugging Face repo of the official checkpoint: the
# transformers `save_pretrained` of `XCodec2Model`, w2v-BERT included.
RELEASES = {"xcodec2": "HKUSTAudio/xcodec2"}
WEIGHTS_FILE = "model.safetensors"
