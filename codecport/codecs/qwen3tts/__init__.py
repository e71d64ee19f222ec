"""Qwen3-TTS's tokenizer (Qwen3-TTS-Tokenizer-12Hz): 16 codebooks of 2048 at 12.5 Hz, 24 kHz
audio. Its encoder is Mimi's with full causal attention, keeping 16 of its 32 quantizer levels;
its decoder is causal end to end (a sliding-window transformer, causal ConvNeXt upsamplers,
SnakeBeta conv blocks), so a step graph with explicit state decodes exactly what the whole clip
gives, a frame at a time.

Its modules by role (docs/architecture.md); `HELPERS` gives the role of those that are its own."""

BUILT_ON = ("mimi",)  # the encoder is Mimi's model; the decoder's attention is Mimi's window
HELPERS = {
    "decoder": "model",  # the decoder in torch: the reference, and the step with explicit state
    "official": "facts",  # the official package as a codec-bench contender, in its own Python
}
