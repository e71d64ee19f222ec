// Windows through masked fixed graphs, as the Python runtime's windowed mode (runtime/plan.py,
// codecs/neucodec/runtime.py): for a codec whose every output depends on the whole clip (NeuCodec's
// attention), a longer clip goes through windows of the graph's length that share `overlap`
// frames; each window is coded as a clip alone, its codes kept from the middle of each overlap,
// its audio cross-faded over it. The arithmetic is float32 step for step, as numpy's, so the
// browser gives the Python runtime's numbers.

import { concatCodes, concatFloat, sliceCodes, toInt32, window } from "./codecport-codes.mjs";
import { CodecportError } from "./codecport-errors.mjs";

/** Code frames of a clip of `n` samples under an encode plan's rule `clip_frames: [hop, add]`. */
export function clipFrames(plan, n) {
  const [hop, add] = plan.clip_frames;
  return Math.floor((n + add) / hop);
}

/** Output of `codec`'s graph `name`, which takes a `mask` of its first `valid` frames: `x`
 * (audio, or codes {data, shape: [K, t]}) zero-padded to its input. */
async function masked(codec, name, x, valid) {
  const g = await codec.graph(name), [v, m] = g.facts.inputs, frames = m.shape[m.shape.length - 1];
  const data = x.shape ? sliceCodes(x, 0, frames).data : window(x, 0, v.shape[v.shape.length - 1]);
  const mask = new Float32Array(frames).fill(1, 0, valid);
  const out = await codec.run(g, { [v.name]: codec.tensor(v.type, data, v.shape), [m.name]: codec.tensor("float32", mask, m.shape) });
  return { data: out[g.facts.outputs[0].name].data, frames };
}

/** Codes [K, frames] of audio `x` coded as a clip alone, through the shortest masked encoder
 * that holds it. */
export async function maskedEncode(codec, x) {
  const plans = codec.plans.encode.filter((q) => q.fits === "masked" && q.graph in codec.manifest.graphs);
  const t = clipFrames(plans[0], x.length), p = plans.find((q) => t <= q.frames);
  if (t < 1) {
    throw new CodecportError(`${x.length} samples at ${codec.inputRate} Hz are under one frame ` +
      `(${plans[0].clip_frames[0]} samples); pass a longer clip`);
  }
  const out = await masked(codec, p.graph, x, t);
  return sliceCodes({ data: toInt32(out.data), shape: [codec.nCodebooks, out.frames] }, 0, t);
}

/** Audio of codes [K, t] decoded as a clip alone, through the shortest masked decoder that holds them. */
export async function maskedDecode(codec, codes) {
  const t = codes.shape[1];
  const p = codec.plans.decode.find((q) => q.fits === "masked" && q.graph in codec.manifest.graphs && t <= q.frames);
  return new Float32Array((await masked(codec, p.graph, codes, t)).data.subarray(0, t * codec.frameSize));
}

/** [audio now final, the new tail] when window `p` follows a window whose last `overlap`
 * samples, not yet returned, are `tail` (null for the first): a linear cross-fade whose gains sum
 * to one (plan.py's `crossfade`). */
export function crossfade(tail, p, overlap) {
  if (tail !== null) {
    if (p.length < overlap) throw new CodecportError(`a window of ${p.length} samples is shorter than the overlap ${overlap}`);
    p = p.slice();
    for (let i = 0; i < overlap; i++) {
      const fade = Math.fround((i + 0.5) / overlap);
      p[i] = Math.fround(tail[i] * Math.fround(1 - fade)) + Math.fround(p[i] * fade);
    }
  }
  return [p.subarray(0, p.length - overlap), p.slice(p.length - overlap)];
}

/** Codes [K, frames] of audio `x` longer than one window: windows of `plan.samples` samples
 * stepping by `frames - overlap` frames, as long as audio runs a frame past them (the official
 * pad makes the clip's last window), each window's codes kept from the middle of each overlap. */
export async function windowedEncode(codec, plan, x) {
  const [hop] = plan.clip_frames, step = plan.frames - plan.overlap, parts = [];
  let start = 0, keepFrom = 0, at = 0;
  while (x.length - at >= plan.samples + hop) {
    const keepTo = start + step + Math.floor(plan.overlap / 2);
    parts.push(sliceCodes(await maskedEncode(codec, x.subarray(at, at + plan.samples)), keepFrom - start, keepTo - start));
    keepFrom = keepTo;
    start += step;
    at += step * hop;
  }
  const last = await maskedEncode(codec, x.subarray(at));
  parts.push(sliceCodes(last, keepFrom - start, last.shape[1]));
  return concatCodes(parts, codec.nCodebooks);
}

/** Audio of codes [K, t]: one masked call when they fit a window, else windows starting every
 * `frames - overlap` frames, cross-faded. */
export async function windowedDecode(codec, plan, codes) {
  const t = codes.shape[1];
  if (t <= plan.frames) return maskedDecode(codec, codes);
  const step = plan.frames - plan.overlap, overlap = plan.overlap * codec.frameSize, out = [];
  let tail = null, now;
  for (let s = 0; s < t - plan.overlap; s += step) {
    [now, tail] = crossfade(tail, await maskedDecode(codec, sliceCodes(codes, s, Math.min(t, s + plan.frames))), overlap);
    out.push(now);
  }
  out.push(tail);
  return concatFloat(out);
}

/** A decoder stream through the windowed plan's windows (the Python `NeuCodecWindowStream`): a
 * window is decoded as soon as its last code arrives and cross-faded into the one before;
 * `flush()` decodes the rest as the last, shorter window. Together: `decode`'s audio for the
 * whole sequence. A frame's audio waits for its window: up to `frames - 1` frames. */
export class WindowStream {
  constructor(codec, plan) {
    Object.assign(this, { codec, plan, side: "decoder", stepFrames: plan.frames - plan.overlap });
    this.latency = { frames: plan.frames - 1, samples: (plan.frames - 1) * codec.frameSize };
    this.reset();
  }

  reset() {
    this._codes = { data: new Int32Array(0), shape: [this.codec.nCodebooks, 0] };
    this._tail = null;
  }

  async _fade(codes) {
    const [now, tail] = crossfade(this._tail, await maskedDecode(this.codec, codes), this.plan.overlap * this.codec.frameSize);
    this._tail = tail;
    return now;
  }

  /** Any number of code frames in, the audio of every window they complete out. */
  async push(x) {
    const k = this.codec.nCodebooks, { frames, overlap } = this.plan, out = [];
    this._codes = concatCodes([this._codes, this.codec.checkCodes(x, true)], k);
    while (this._codes.shape[1] >= frames) {
      out.push(await this._fade(sliceCodes(this._codes, 0, frames)));
      this._codes = sliceCodes(this._codes, frames - overlap, this._codes.shape[1]);
    }
    return concatFloat(out);
  }

  /** The rest: the last window, faded in (or the codes as one clip when no window came). */
  async flush() {
    const t = this._codes.shape[1], out = [];
    if (this._tail === null) {
      if (t) out.push(await maskedDecode(this.codec, this._codes));
    } else {
      if (t > this.plan.overlap) out.push(await this._fade(this._codes));
      out.push(this._tail);
    }
    this.reset();
    return concatFloat(out);
  }
}
