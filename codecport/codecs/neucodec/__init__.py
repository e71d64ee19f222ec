"""NeuCodec (NeuTTS Air's codec): w2v-BERT's first layers and an inverse STFT, both in the graphs,
an FSQ of one codebook, and its distilled encoder (DistilHuBERT with a small acoustic encoder).
XCodec2 is built on it (codecs/xcodec2/).

Its modules by role (docs/architecture.md); `HELPERS` gives the role of those that are its own."""

HELPERS = {
    "encoder": "model",  # its acoustic and semantic encoders
    "w2vbert": "model",  # w2v-BERT 2.0's first layers, the semantic model it reads
    "w2vbert_config": "config",
    "distill": "model",  # the distilled variant's encoders: DistilHuBERT, DistillCodecEncoder
    "distill_config": "config",
    "istft": "model",  # Vocos' inverse STFT as a MatMul (no DFT, no ConvTranspose)
    "ingraph": "export",  # the fbank features and the FSQ as graph ops, for the browser's graphs
    "fsq": "runtime",  # the FSQ, numpy
    "fbank": "runtime",  # w2v-BERT's input features and DistilHuBERT's samples, numpy
}
