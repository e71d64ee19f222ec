"""XCodec2 (Llasa's codec, 16 kHz): NeuCodec's model with other sizes, its encoder's two paths
lined up as XCodec2 does. Each of its modules is thin, naming NeuCodec's.

Its modules by role (docs/architecture.md)."""

BUILT_ON = ("neucodec",)  # the codec whose modules it imports
