"""SNAC (the multi-scale codec of Orpheus TTS): windows with a mask for any length, a stateful
step decoder for codes an LLM emits a frame at a time, and the Orpheus layout of its codes.

Its modules by role (docs/architecture.md); `HELPERS` gives the role of those that are its own."""

HELPERS = {
    "stepmodel": "model",  # the decoder as a step with explicit state, in torch (traced to decoder_step)
    "stream": "runtime",  # its decoder streams on that step graph (and on older folders' windows)
    "noise": "runtime",  # the noise its decoder draws, the same however the audio is split
    "rvq": "runtime",  # its multi-scale RVQ, numpy
}
