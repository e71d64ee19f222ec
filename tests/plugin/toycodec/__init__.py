"""A codec that lives outside codecport, as a third party would write one: the roles of
docs/architecture.md's "Adding a codec" in a package of its own, found through the
`codecport.codecs` entry point its distribution declares (toycodec-0.1.dist-info beside it).

The codec is as small as a real one can be: each frame of `frame_size` samples goes through a
linear map to a latent, quantized by a residual VQ of Euclidean codebooks, and decoded causally
(a frame's audio sees its own latent and the one before), so it streams through a step graph
whose state is the previous latent."""
