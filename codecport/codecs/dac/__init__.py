"""DAC (Descript Audio Codec), and the stereo DAC TSAC builds on: fixed-length and chunked graphs,
windows overlapping by the receptive field for any length, the official `.dac` codes file.

Its modules by role (docs/architecture.md); `HELPERS` gives the role of those that are its own."""

HELPERS = {"official": "facts"}  # the official package as a codec-bench contender, in its own Python
