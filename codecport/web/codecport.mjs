// codecport.mjs: codecport's browser runtime. It runs a folder written by
// `codec-export CODEC --target web` with the onnxruntime-web the app passes in, and gives the
// Python runtime's codes and audio: it follows the ways through the graphs the folder's manifest
// states (`plans`: fixed calls, windows, step graphs and their state), restores the original
// length and, where the codec keeps it (DAC), the loudness, as the Python runtime does.
//
//   import * as ort from "onnxruntime-web";
//   import { load, readCodes } from "codecport";   // the npm package (or "./codecport.mjs", copied)
//   const codec = await load("/model/", { ort, executionProviders: ["wasm"] });
//   const codes = await codec.encode(pcm);        // Float32Array at codec.inputRate, mono
//   const audio = await codec.decode(codes);      // {data, shape: [K, T], numSamples...} -> Float32Array
//   const back = await codec.decode(await readCodes(bytesOfAnNpz));  // codes codec-run wrote
//   const e = codec.encoderStream(), d = codec.decoderStream();     // codecs with step graphs
//   const audioNow = await d.push(await e.push(pcmChunk));          // ... e.flush(), d.flush()
//
// No dependencies and no build step: the manifest says everything (the browser cannot read ONNX
// metadata or rvq.npz), and every failure is a CodecportError saying what to do.

import { checkFields, concatCodes, concatFloat, exactly, readCodes, roundHalfEven, sliceCodes, toInt32, toInt64, window } from "./codecport-codes.mjs";
import { CodecportError } from "./codecport-errors.mjs";
import { fetchBytes, fetchJson } from "./codecport-fetch.mjs";
import { integratedLoudness } from "./codecport-loudness.mjs";
import { checkManifest, positive } from "./codecport-manifest.mjs";
import { clipFrames, maskedDecode, maskedEncode, WindowStream, windowedDecode, windowedEncode } from "./codecport-windows.mjs";

export { CodecportError, readCodes };
export const VERSION = "0.3.0";

/** The codec of the export folder at `folderUrl`. `ort` is the app's onnxruntime-web module;
 * `executionProviders` go to every session ("wasm", "webgpu"; default ["wasm"]); `sides` the
 * directions the app will run (["decode"] opens no encoder: a TTS page, or a folder whose encoder
 * is too big for wasm32). Set `ort.env.wasm.numThreads` and `wasmPaths` before the first load. */
export async function load(folderUrl, { ort, executionProviders = ["wasm"], sessionOptions = {}, sides = ["encode", "decode"] } = {}) {
  if (!ort || !ort.InferenceSession || !ort.Tensor) {
    throw new CodecportError("load(folderUrl, {ort}) needs the app's onnxruntime-web module as `ort` " +
      '(import * as ort from "onnxruntime-web")');
  }
  const base = new URL(String(folderUrl).replace(/\/?$/, "/"), globalThis.location?.href).href;
  const manifest = await fetchJson(base + "manifest.json");
  if (typeof manifest !== "object" || manifest === null || typeof manifest.codec !== "string") {
    throw new CodecportError(`${base}manifest.json is not a codecport manifest; point load() at a folder ` +
      "written by codec-export --target web");
  }
  if (manifest.quantizer !== "graph" || typeof manifest.graphs !== "object" || manifest.graphs === null) {
    throw new CodecportError(`${base} is not a web export (its quantizer is in rvq.npz, which the browser ` +
      `cannot read); re-export it with codec-export ${manifest.codec} --target web`);
  }
  if (!Array.isArray(manifest.plans?.encode) || !Array.isArray(manifest.plans?.decode)) {
    throw new CodecportError(`${base} was exported without the plans codecport.mjs ${VERSION} follows; ` +
      `re-export it with codec-export ${manifest.codec} --target web`);
  }
  checkManifest(base, manifest);
  if (manifest.precision === "int8" && executionProviders.some((ep) => (ep?.name ?? ep) === "webgpu")) {
    // Measured: onnxruntime-web 1.30's WebGPU gave wrong audio for the QDQ graphs (docs/web.md).
    throw new CodecportError(`${base} is an int8 export, which onnxruntime-web's WebGPU runs wrongly; ` +
      'run it with executionProviders: ["wasm"], or load an fp32 folder on webgpu');
  }
  if (!Array.isArray(sides) || !sides.length || sides.some((s) => s !== "encode" && s !== "decode")) {
    throw new CodecportError('load(folderUrl, {sides}) takes ["encode"], ["decode"] or both');
  }
  const codec = new Codec(base, manifest, ort, { ...sessionOptions, executionProviders }, sides);
  await codec.graph(codec.present[0]); // a folder that cannot run fails here, not at the first encode
  return codec;
}

function zeros(type, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  const Array_ = { float32: Float32Array, float16: Uint16Array, int64: BigInt64Array, int32: Int32Array }[type];
  if (!Array_) throw new CodecportError(`state of type ${type} is not something codecport.mjs feeds`);
  return new Array_(n);
}

/** A web folder's codec: its facts (sampleRate, frameSize, nCodebooks, codebookSize, codec,
 * preset, precision), `encode`, `decode` and, where it has step graphs, its streams. */
export class Codec {
  constructor(base, manifest, ort, options, sides = ["encode", "decode"]) {
    Object.assign(this, { url: base, manifest, ort, options, sides, plans: manifest.plans });
    Object.assign(this, { codec: manifest.codec, preset: manifest.preset ?? manifest.variant,
      exportId: manifest.export_id, precision: manifest.precision ?? "fp32" });
    this.executionProviders = options.executionProviders;
    const num = (key) => positive(manifest[key], `${base}manifest.json's ${key}`);
    this.sampleRate = num("sample_rate");
    this.frameSize = num("frame_size");
    this.nCodebooks = num("n_codebooks");
    this.codebookSize = num("codebook_size");
    this.frameRate = this.sampleRate / this.frameSize;
    // The rate encode takes: the decoder's, but for a codec that encodes at another (NeuCodec's 16 kHz).
    this.inputRate = manifest.input_rate == null ? this.sampleRate : num("input_rate");
    this.present = [...new Set(sides.flatMap((s) => this.plans[s]).map((p) => p.graph).filter((g) => g in manifest.graphs))];
    if (this.present.length === 0) {
      throw new CodecportError(`${base} has none of the graphs its plans name; copy the whole export folder`);
    }
    this.streams = ["encoder", "decoder"].filter((side) => sides.includes(side.slice(0, -1)) &&
      (this._plan(side, "step") || (side === "decoder" && this._plan(side, "windowed"))));
    this._sessions = {};
    this._queue = Promise.resolve(); // onnxruntime-web runs one session call at a time
  }

  _side(side) {
    if (!this.sides.includes(side)) {
      throw new CodecportError(`this codec was loaded with sides: ${JSON.stringify(this.sides)}; load it with "${side}" among them to ${side}`);
    }
  }

  _plan(side, mode) {
    const p = this.plans[side === "encoder" ? "encode" : "decode"].find((q) => q.mode === mode);
    return p && p.graph in this.manifest.graphs ? p : undefined;
  }

  facts(name) {
    const f = this.manifest.graphs[name];
    if (!f) throw new CodecportError(`${this.url} has no ${name}.onnx; re-export it with codec-export ${this.codec} --target web`);
    return f;
  }

  /** The session of graph `name`, created on first use and checked against the manifest. */
  graph(name) {
    if (!(name in this._sessions)) this._sessions[name] = this._open(name);
    return this._sessions[name];
  }

  async _open(name) {
    const f = this.facts(name);
    const meta = f.metadata ?? {};
    for (const [key, want] of [["codec", this.codec], ["export_id", this.exportId]]) {
      if (meta[key] !== want) {
        throw new CodecportError(`${this.url}${f.file}: its manifest entry says ${key} ${meta[key]}, ` +
          `expected ${want}; re-export the folder`);
      }
    }
    const url = new URL(f.file, this.url).href;
    const response = await fetchBytes(url, "the folder is incomplete; copy the whole export folder");
    const bytes = new Uint8Array(await response.arrayBuffer());
    let session;
    try {
      session = await this.ort.InferenceSession.create(bytes, this.options);
    } catch (e) {
      throw new CodecportError(`${url}: onnxruntime-web cannot run it on ${this.executionProviders.join(", ")} ` +
        `(${String(e.message ?? e).split("\n")[0]}); check it with codec-export check, or re-export the folder`);
    }
    const names = (list) => list.map((v) => v.name).join(",");
    if (session.inputNames.join(",") !== names(f.inputs) || session.outputNames.join(",") !== names(f.outputs)) {
      throw new CodecportError(`${url} does not match its manifest entry (inputs ${session.inputNames}); ` +
        "re-export the folder");
    }
    // Types and shapes too, where this onnxruntime-web reports them (1.22 and later): a graph of
    // another export with the same names would otherwise run on the wrong lengths.
    const got = [...(session.inputMetadata ?? []), ...(session.outputMetadata ?? [])];
    const want = [...f.inputs, ...f.outputs];
    const bad = got.findIndex((m, i) => m.isTensor && (m.type !== want[i].type || String(m.shape) !== String(want[i].shape)));
    if (bad >= 0) {
      throw new CodecportError(`${url} does not match its manifest entry (${got[bad].name} is ${got[bad].type} ` +
        `[${got[bad].shape}], the manifest says ${want[bad].type} [${want[bad].shape}]); re-export the folder`);
    }
    return { session, facts: f, name };
  }

  /** Outputs of graph `g` for `feeds` (name -> ort.Tensor), one call at a time per codec. */
  run(g, feeds) {
    const next = this._queue.then(() => g.session.run(feeds));
    this._queue = next.catch(() => {});
    return next;
  }

  /** An ort.Tensor; codes held as numbers become the BigInt64Array an int64 input takes. */
  tensor(type, data, shape) {
    return new this.ort.Tensor(type, type === "int64" && !(data instanceof BigInt64Array) ? toInt64(data) : data, shape);
  }

  async _call(name, input) {
    const g = await this.graph(name);
    const v = g.facts.inputs[0];
    const out = await this.run(g, { [v.name]: this.tensor(v.type, input.data ?? input, v.shape) });
    return out[g.facts.outputs[0].name].data;
  }

  /** Codes [K, frames] of one encoder call of graph `name` on `x` (its exact input length). */
  async encodeCall(name, x) {
    const g = await this.graph(name);
    const [, k, frames] = g.facts.outputs[0].shape;
    return { data: toInt32(await this._call(name, x)), shape: [k, frames] };
  }

  /** Audio of one decoder call of graph `name` on codes [K, frames] (its exact input length). */
  async decodeCall(name, codes) {
    return new Float32Array(await this._call(name, codes));
  }

  checkAudio(pcm) {
    if (!(pcm instanceof Float32Array)) {
      throw new CodecportError(`encode takes a Float32Array of mono samples at ${this.inputRate} Hz`);
    }
    if (pcm.length === 0) throw new CodecportError("the audio is empty; there is nothing to encode");
    for (let i = 0; i < pcm.length; i++) {
      if (!Number.isFinite(pcm[i])) throw new CodecportError("audio contains NaN or infinite samples; fix the input before encoding");
      // Far past int16's full scale a codec's arithmetic overflows (the Python runtime's MAX_AMPLITUDE).
      if (Math.abs(pcm[i]) > 32768) {
        throw new CodecportError(`audio samples reach ${pcm[i]}, which no audio in [-1, 1] does; scale it to [-1, 1] ` +
          "(integer PCM divided by its full scale, e.g. 32768)");
      }
    }
  }

  /** `codes` ({data, shape: [K, T], fields...}) as this decoder takes them, or a CodecportError;
   * no frames at all only where `empty` allows it (a stream's push). */
  checkCodes(codes, empty = false) {
    const shape = codes?.shape;
    if (!shape || shape.length !== 2 || !codes.data || codes.data.length !== shape[0] * shape[1] || (shape[1] === 0 && !empty)) {
      throw new CodecportError("codes must be {data, shape: [codebooks, frames]} with data of that many values");
    }
    if (shape[0] !== this.nCodebooks) {
      throw new CodecportError(`this decoder has the quantizer inside and takes exactly ${this.nCodebooks} ` +
        `codebooks, got ${shape[0]}`);
    }
    for (const [key, want] of [["codec", this.codec], ["preset", this.preset]]) {
      if (codes[key] != null && codes[key] !== want) {
        throw new CodecportError(`these codes were made by ${codes.codec} ${codes.preset ?? ""}; this folder holds ` +
          `${this.codec} ${this.preset}`);
      }
    }
    checkFields(codes, this);
    const data = toInt32(codes.data);
    for (let i = 0; i < data.length; i++) {
      if (!(data[i] >= 0 && data[i] < this.codebookSize) || data[i] !== Number(codes.data[i])) {
        throw new CodecportError(`codes must be integers in [0, ${this.codebookSize}), found ${codes.data[i]}; ` +
          "were they made by another model?");
      }
    }
    return { ...codes, data, shape: [...shape] };
  }

  /** Codes of mono audio at `inputRate` (with numSamples, sampleRate and, for a codec that keeps
   * it, loudnessDb): the first of the folder's encode plans that takes the clip, as codec-run. */
  async encode(pcm) {
    this._side("encode");
    this.checkAudio(pcm);
    const plans = this.plans, n = pcm.length;
    const loudnessDb = plans.loudness ? integratedLoudness(pcm, this.sampleRate, plans.loudness) : undefined;
    let x = pcm;
    if (plans.peak_limit) { // the official `ensure_max_of_audio`: a peak above the limit is scaled to it
      let peak = 0;
      for (let i = 0; i < n; i++) peak = Math.max(peak, Math.abs(pcm[i]));
      const gain = Math.fround(plans.peak_limit / Math.max(peak, plans.peak_limit));
      if (gain !== 1) x = pcm.map((v) => v * gain);
    }
    const fields = { codec: this.codec, preset: this.preset, exportId: this.exportId, sampleRate: this.inputRate,
      numSamples: n, ...(loudnessDb === undefined ? {} : { loudnessDb }) };
    for (const p of plans.encode.filter((q) => q.graph in this.manifest.graphs)) {
      if (p.fits === "masked" && clipFrames(p, n) <= p.frames) return { ...await maskedEncode(this, x), ...fields, mode: "fixed" };
      if (p.mode === "windowed") return { ...await windowedEncode(this, p, x), ...fields, mode: "windowed" };
      const fits = p.fits === "up-to" ? n <= p.samples : p.fits === "exact" && Math.ceil(n / this.frameSize) === p.frames;
      if (p.mode === "fixed" && fits) {
        const codes = await this.encodeCall(p.graph, window(x, 0, p.samples));
        return { ...sliceCodes(codes, 0, p.fits === "up-to" ? Math.ceil(n / this.frameSize) : p.frames), ...fields, mode: "fixed" };
      }
      if (p.mode === "chunked") {
        const parts = [];
        for (let s = 0; s < n; s += p.step) parts.push(await this.encodeCall(p.graph, window(x, s - p.delay, p.window)));
        return { ...concatCodes(parts, this.nCodebooks), ...fields, mode: "chunked", chunkFrames: p.frames };
      }
      if (p.mode === "step") {
        const s = this.encoderStream();
        return { ...concatCodes([await s.push(x), await s.flush()], this.nCodebooks), ...fields, mode: "step" };
      }
    }
    throw new CodecportError(`${n} samples fit none of this folder's encoders; re-export it with a longer --len`);
  }

  /** Audio (Float32Array at `sampleRate`) of codes: the decode plan their mode names (a causal
   * codec takes any), else the first that takes their frames; then the loudness and the original
   * length restored where the codes carry them. Codes of another original rate come back at the
   * model's rate, `round(numSamples * sampleRate / theirRate)` long: the app resamples them. */
  async decode(codes) {
    this._side("decode");
    const c = this.checkCodes(codes), t = c.shape[1];
    const mode = this.plans.causal ? undefined : c.mode;
    const plans = this.plans.decode.filter((p) => p.graph in this.manifest.graphs && (mode == null || p.mode === mode));
    const p = plans.find((q) => q.mode !== "fixed" || (q.fits === "exact" ? t === q.frames : t <= q.frames));
    if (p === undefined) {
      throw new CodecportError(`${t} frames${mode ? ` of ${mode} codes` : ""} fit none of this folder's decoders ` +
        `(${this.plans.decode.map((q) => q.mode).join(", ")}); decode them with codec-run`);
    }
    let audio;
    if (p.fits === "masked") {
      audio = await maskedDecode(this, c);
    } else if (p.mode === "windowed") {
      audio = await windowedDecode(this, p, c);
    } else if (p.mode === "fixed") {
      audio = (await this.decodeCall(p.graph, sliceCodes(c, 0, p.frames))).slice(0, p.fits === "up-to" ? t * this.frameSize : undefined);
    } else if (p.mode === "chunked") {
      if (c.chunkFrames != null && c.chunkFrames !== p.frames || t % p.frames) {
        const theirs = c.chunkFrames != null ? ` (made in chunks of ${c.chunkFrames})` : "";
        throw new CodecportError(`${t} frames${theirs} are not whole chunks of this model's ${p.frames} frames; ` +
          "re-encode with this model");
      }
      const parts = [];
      for (let i = 0; i < t; i += p.frames) parts.push(await this.decodeCall(p.graph, sliceCodes(c, i, i + p.frames)));
      audio = concatFloat(parts);
    } else {
      const s = this.decoderStream();
      audio = concatFloat([await s.push(c), await s.flush()]);
    }
    if (c.loudnessDb != null && this.plans.loudness) { // measured on the whole decode, as the official decompress
      const gain = Math.fround(10 ** ((c.loudnessDb - integratedLoudness(audio, this.sampleRate, this.plans.loudness)) / 20));
      audio = audio.map((v) => v * gain);
    }
    if (c.numSamples != null && c.sampleRate != null) {
      audio = exactly(audio, c.sampleRate === this.sampleRate ? c.numSamples : roundHalfEven(c.numSamples * this.sampleRate / c.sampleRate));
    }
    return audio;
  }

  /** A stream of the encoder step graph: push(pcm) -> codes now final; flush() -> the rest. */
  encoderStream() {
    this._side("encode");
    return new StepStream(this, "encoder");
  }

  /** A stream of the decoder step graph (or, without one, of the windowed plan's windows):
   * push(codes) -> audio now final; flush() -> the rest. */
  decoderStream() {
    this._side("decode");
    const w = this._plan("decoder", "windowed");
    return w && !this._plan("decoder", "step") ? new WindowStream(this, w) : new StepStream(this, "decoder");
  }
}

/** One step graph with its state: each `<name>_out` of a call is the `<name>_in` of the next, as
 * the manifest's plan pairs them. (onnxruntime-web 1.30's wasm provider leaves pre-allocated CPU
 * outputs unwritten, so ORT allocates each step's state; nothing here writes into given tensors.) */
class StepStream {
  constructor(codec, side) {
    const plan = codec._plan(side, "step");
    if (!plan) {
      const have = codec.streams.length ? `it streams only its ${codec.streams.join(" and ")} side` : "it has no step graphs";
      throw new CodecportError(`${codec.codec} has no ${side} stream: ${have}`);
    }
    Object.assign(this, { codec, side, plan, stepFrames: plan.frames, stepSamples: plan.frames * codec.frameSize });
    // A step plan is a stateful graph fed whole steps: a frame waits for the rest of its step, so
    // its result is at most frames - 1 frames late, whatever the codec (Python's step streams).
    this.latency = { frames: plan.frames - 1, samples: (plan.frames - 1) * codec.frameSize };
    this._ready = codec.graph(plan.graph);
    this.reset();
  }

  reset() {
    this._state = null;
    this._buffer = this.side === "encoder" ? new Float32Array(0) : { data: new Int32Array(0), shape: [this.codec.nCodebooks, 0] };
  }

  async _step(x) {
    const g = await this._ready, v = g.facts.inputs[0];
    this._state ??= Object.fromEntries(this.plan.state.map(([name]) => {
      const t = g.facts.inputs.find((i) => i.name === name);
      return [name, this.codec.tensor(t.type, zeros(t.type, t.shape), t.shape)];
    }));
    const out = await this.codec.run(g, { [v.name]: this.codec.tensor(v.type, x, v.shape),
      ...this._state });
    this._state = Object.fromEntries(this.plan.state.map(([i, o]) => [i, out[o]]));
    return out[g.facts.outputs[0].name].data;
  }

  /** Encoder: any number of samples in, the codes [K, t] of every whole step out (t may be 0).
   * Decoder: any number of code frames in, the audio of every whole step out. */
  async push(x) {
    if (this.side === "encoder") {
      this.codec.checkAudio(x.length === 0 ? new Float32Array(1) : x);
      const buf = concatFloat([this._buffer, x]), n = Math.floor(buf.length / this.stepSamples) * this.stepSamples;
      const parts = [];
      for (let i = 0; i < n; i += this.stepSamples) { // a copy, not a view: a proxied wasm moves the buffer
        parts.push({ data: toInt32(await this._step(buf.slice(i, i + this.stepSamples))), shape: [this.codec.nCodebooks, this.stepFrames] });
      }
      this._buffer = buf.slice(n);
      return concatCodes(parts, this.codec.nCodebooks);
    }
    const codes = this.codec.checkCodes(x, true), k = this.codec.nCodebooks;
    const buf = concatCodes([this._buffer, codes], k), t = buf.shape[1], n = Math.floor(t / this.stepFrames) * this.stepFrames;
    const parts = [];
    for (let i = 0; i < n; i += this.stepFrames) parts.push(new Float32Array(await this._step(sliceCodes(buf, i, i + this.stepFrames).data)));
    this._buffer = sliceCodes(buf, n, t);
    return concatFloat(parts);
  }

  /** The rest, the last step padded (zeros, code 0, as moshi pads) and trimmed to what was pushed. */
  async flush() {
    const k = this.codec.nCodebooks;
    if (this.side === "encoder") {
      const rem = this._buffer.length;
      if (rem === 0) return concatCodes([], k);
      return sliceCodes(await this.push(new Float32Array(this.stepSamples - rem)), 0, Math.ceil(rem / this.codec.frameSize));
    }
    const rem = this._buffer.shape[1];
    if (rem === 0) return new Float32Array(0);
    const pad = this.stepFrames - rem;
    return (await this.push({ data: new Int32Array(k * pad), shape: [k, pad] })).slice(0, rem * this.codec.frameSize);
  }
}
