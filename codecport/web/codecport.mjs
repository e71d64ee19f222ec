// codecport.mjs: codecport's browser runtime. It runs a folder written by
// `codec-export dac|mimi --target web` with the onnxruntime-web the app passes in, and gives the
// Python runtime's codes and audio (the same ways through the graphs, the same padding).
//
//   import * as ort from "onnxruntime-web";
//   import { load } from "codecport/codecport.mjs";
//   const codec = await load("/model/", { ort, executionProviders: ["wasm"] });
//   const codes = await codec.encode(pcm);        // Float32Array at codec.sampleRate, mono
//   const audio = await codec.decode(codes);      // {data: Int32Array, shape: [K, T]} -> Float32Array
//   const s = codec.stream();                     // Mimi: s.encodeStep(pcm), s.decodeStep(codes), s.reset()
//
// No dependencies and no build step: the folder's manifest.json says everything (the browser
// cannot read ONNX metadata or .npz), and every failure is a CodecportError saying what to do.

export const VERSION = "0.2.0";

export class CodecportError extends Error {
  constructor(message) {
    super(message);
    this.name = "CodecportError";
  }
}

const CODECS = { dac: () => DacCodec, mimi: () => MimiCodec };

/** The codec of the export folder at `folderUrl`. `ort` is the app's onnxruntime-web module;
 * `executionProviders` go to every session ("wasm", "webgpu"; default ["wasm"]). Set
 * `ort.env.wasm.numThreads` and `wasmPaths` before the first load. */
export async function load(folderUrl, { ort, executionProviders = ["wasm"], sessionOptions = {} } = {}) {
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
  const make = CODECS[manifest.codec];
  if (!make) {
    throw new CodecportError(`${base} holds a ${manifest.codec} export, which codecport.mjs ${VERSION} ` +
      `cannot run (it runs ${Object.keys(CODECS).join(", ")})`);
  }
  if (manifest.quantizer !== "graph" || typeof manifest.graphs !== "object" || manifest.graphs === null) {
    throw new CodecportError(`${base} is not a web export (its quantizer is in rvq.npz, which the browser ` +
      `cannot read); re-export it with codec-export ${manifest.codec} --target web`);
  }
  if (manifest.precision === "int8" && executionProviders.some((ep) => (ep?.name ?? ep) === "webgpu")) {
    // Measured: onnxruntime-web 1.30's WebGPU gave wrong audio for the QDQ graphs (docs/web.md).
    throw new CodecportError(`${base} is an int8 export, which onnxruntime-web's WebGPU runs wrongly; ` +
      'run it with executionProviders: ["wasm"], or load an fp32 folder on webgpu');
  }
  const Codec = make();
  const codec = new Codec(base, manifest, ort, { ...sessionOptions, executionProviders });
  const first = Object.keys(Codec.graphs).find((g) => g in manifest.graphs);
  if (first === undefined) {
    throw new CodecportError(`${base} has none of the ${manifest.codec} graphs ` +
      `(${Object.keys(Codec.graphs).join(", ")}); re-export it with codec-export ${manifest.codec} --target web`);
  }
  await codec.graph(first); // a folder that cannot run fails here, not at the first encode
  return codec;
}

async function fetchBytes(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new CodecportError(`${url}: could not be fetched (${e.message}); is the server up and the URL right?`);
  }
  if (!response.ok) {
    throw new CodecportError(`${url}: HTTP ${response.status}; ${what}`);
  }
  return response;
}

async function fetchJson(url) {
  const response = await fetchBytes(url, "is the model folder's URL right? It must hold a codec-export " +
    "--target web folder");
  try {
    return JSON.parse(await response.text());
  } catch (e) {
    throw new CodecportError(`${url}: not JSON (${e.message}); re-run codec-export --target web`);
  }
}

function metaInt(facts, key) {
  const v = Number(facts.metadata?.[key]);
  if (!Number.isInteger(v) || v < 0) {
    throw new CodecportError(`${facts.file}: its manifest entry has no integer ${key}; re-export the folder`);
  }
  return v;
}

function zeros(type, shape) {
  const n = shape.reduce((a, b) => a * b, 1);
  const Array_ = { float32: Float32Array, float16: Uint16Array, int64: BigInt64Array, int32: Int32Array }[type];
  if (!Array_) throw new CodecportError(`state of type ${type} is not something codecport.mjs feeds`);
  return new Array_(n);
}

function toInt64(values) {
  const out = new BigInt64Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = BigInt(values[i]);
  return out;
}

function toInt32(values) {
  const out = new Int32Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = Number(values[i]);
  return out;
}

function concatFloat(parts) {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Codes [K, T] side by side: parts of shape [K, t_i] -> [K, sum t_i]. */
function concatCodes(parts, k) {
  const t = parts.reduce((n, p) => n + p.shape[1], 0);
  const data = new Int32Array(k * t);
  let at = 0;
  for (const p of parts) {
    const n = p.shape[1];
    for (let i = 0; i < k; i++) data.set(p.data.subarray(i * n, (i + 1) * n), i * t + at);
    at += n;
  }
  return { data, shape: [k, t] };
}

/** Frames [from, to) of codes [K, T], zero-padded (code 0) past T up to `to`. */
function sliceCodes(codes, from, to) {
  const [k, t] = codes.shape;
  const n = to - from;
  const data = new Int32Array(k * n);
  for (let i = 0; i < k; i++) {
    data.set(codes.data.subarray(i * t + from, i * t + Math.min(to, t)), i * n);
  }
  return { data, shape: [k, n] };
}

/** Samples [from, from + n) of `x`, zeros outside it. */
function window(x, from, n) {
  const out = new Float32Array(n);
  const lo = Math.max(0, from), hi = Math.min(x.length, from + n);
  if (hi > lo) out.set(x.subarray(lo, hi), lo - from);
  return out;
}

class Codec {
  static graphs = {};

  constructor(base, manifest, ort, options) {
    this.url = base;
    this.manifest = manifest;
    this.ort = ort;
    this.options = options;
    this.codec = manifest.codec;
    this.variant = manifest.variant;
    this.exportId = manifest.export_id;
    this.precision = manifest.precision ?? "fp32";
    this.executionProviders = options.executionProviders;
    const num = (key) => {
      const v = Number(manifest[key]);
      if (!Number.isInteger(v) || v <= 0) {
        throw new CodecportError(`${base}manifest.json has no positive integer ${key}; re-export the folder`);
      }
      return v;
    };
    this.sampleRate = num("sample_rate");
    this.frameSize = num("frame_size");
    this.nCodebooks = num("n_codebooks");
    this.codebookSize = num("codebook_size");
    this.frameRate = this.sampleRate / this.frameSize;
    this.present = Object.keys(this.constructor.graphs).filter((g) => g in manifest.graphs);
    this._sessions = {};
    this._queue = Promise.resolve(); // onnxruntime-web runs one session call at a time
  }

  facts(name) {
    const f = this.manifest.graphs[name];
    if (!f) {
      throw new CodecportError(`${this.url} has no ${name}.onnx; ${this.missing(name)}`);
    }
    return f;
  }

  missing() {
    return `re-export it with codec-export ${this.codec} --target web`;
  }

  /** The session of graph `name`, created on first use and checked against the manifest. */
  async graph(name) {
    if (!(name in this._sessions)) {
      this._sessions[name] = this._open(name);
    }
    return this._sessions[name];
  }

  async _open(name) {
    const f = this.facts(name);
    const [role, mode] = this.constructor.graphs[name];
    const meta = f.metadata ?? {};
    for (const [key, want] of [["codec", this.codec], ["export_id", this.exportId], ["role", role], ["mode", mode]]) {
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

  tensor(type, data, shape) {
    return new this.ort.Tensor(type, data, shape);
  }

  async _call(name, input) {
    const g = await this.graph(name);
    const v = g.facts.inputs[0];
    const data = v.type === "int64" ? toInt64(input.data ?? input) : input.data ?? input;
    const out = await this.run(g, { [v.name]: this.tensor(v.type, data, v.shape) });
    return out[g.facts.outputs[0].name].data;
  }

  /** Audio [T * frame] from codes [K, T] through one decoder call of exactly T frames. */
  async decodeCall(name, codes) {
    return new Float32Array(await this._call(name, codes));
  }

  /** Codes [K, frames] of one encoder call on `samples` samples (zero-padded `x`). */
  async encodeCall(name, x) {
    const g = await this.graph(name);
    const [, k, frames] = g.facts.outputs[0].shape;
    return { data: toInt32(await this._call(name, x)), shape: [k, frames] };
  }

  checkAudio(pcm) {
    if (!(pcm instanceof Float32Array)) {
      throw new CodecportError(`encode takes a Float32Array of mono samples at ${this.sampleRate} Hz`);
    }
    if (pcm.length === 0) throw new CodecportError("the audio is empty; there is nothing to encode");
    for (let i = 0; i < pcm.length; i++) {
      if (!Number.isFinite(pcm[i])) {
        throw new CodecportError("audio contains NaN or infinite samples; fix the input before encoding");
      }
    }
  }

  /** `codes` ({data, shape: [K, T]}) as this decoder takes them, or a CodecportError. */
  checkCodes(codes) {
    const shape = codes?.shape;
    if (!shape || shape.length !== 2 || !codes.data || codes.data.length !== shape[0] * shape[1]) {
      throw new CodecportError("codes must be {data, shape: [codebooks, frames]} with data of that many values");
    }
    if (shape[0] !== this.nCodebooks) {
      throw new CodecportError(`this decoder has the quantizer inside and takes exactly ${this.nCodebooks} ` +
        `codebooks, got ${shape[0]}`);
    }
    const data = toInt32(codes.data);
    for (let i = 0; i < data.length; i++) {
      if (!(data[i] >= 0 && data[i] < this.codebookSize) || data[i] !== Number(codes.data[i])) {
        throw new CodecportError(`codes must be integers in [0, ${this.codebookSize}), found ${codes.data[i]}; ` +
          "were they made by another model?");
      }
    }
    return { data, shape: [...shape] };
  }

  stream() {
    throw new CodecportError(`${this.label} has no streaming step graphs; stream() is Mimi's`);
  }
}

class DacCodec extends Codec {
  static graphs = { encoder: ["encoder", "fixed"], decoder: ["decoder", "fixed"],
    encoder_chunked: ["encoder", "chunked"], decoder_chunked: ["decoder", "chunked"] };
  label = "DAC";

  fixedFrames() {
    const name = ["encoder", "decoder"].find((g) => this.present.includes(g));
    return name === undefined ? null : metaInt(this.facts(name), "frames");
  }

  /** Codes {data, shape: [K, T]} of mono audio at `sampleRate`: as codec-run encode, the fixed
   * graph when the clip's frames are its frames, else the official chunked windows. */
  async encode(pcm) {
    this.checkAudio(pcm);
    let peak = 0;
    for (let i = 0; i < pcm.length; i++) peak = Math.max(peak, Math.abs(pcm[i]));
    // The official `ensure_max_of_audio`: a peak above 1 is scaled down to 1.
    const gain = Math.fround(1 / Math.max(peak, 1));
    const x = gain === 1 ? pcm : pcm.map((v) => v * gain);
    const n = x.length;
    if (this.present.includes("encoder") && Math.ceil(n / this.frameSize) === this.fixedFrames()) {
      return this.encodeCall("encoder", window(x, 0, metaInt(this.facts("encoder"), "samples")));
    }
    const f = this.facts("encoder_chunked");
    const [win, step, delay] = ["window", "chunk_step", "delay"].map((k) => metaInt(f, k));
    const parts = [];
    for (let s = 0; s < n; s += step) parts.push(await this.encodeCall("encoder_chunked", window(x, s - delay, win)));
    return concatCodes(parts, this.nCodebooks);
  }

  /** Audio (Float32Array at `sampleRate`) of codes [K, T]: the fixed decoder when T is its
   * frames, else the chunked decoder chunk by chunk. */
  async decode(codes) {
    codes = this.checkCodes(codes);
    const t = codes.shape[1];
    if (t === this.fixedFrames() && this.present.includes("decoder")) return this.decodeCall("decoder", codes);
    const name = this.present.includes("decoder_chunked") ? "decoder_chunked" : "encoder_chunked";
    const chunk = metaInt(this.facts(name), "chunk_frames");
    if (t % chunk !== 0) {
      throw new CodecportError(`${t} frames is neither the fixed length ${this.fixedFrames()} nor a multiple ` +
        `of the chunk length ${chunk}; re-encode with this model`);
    }
    const parts = [];
    for (let i = 0; i < t; i += chunk) parts.push(await this.decodeCall("decoder_chunked", sliceCodes(codes, i, i + chunk)));
    return concatFloat(parts);
  }
}

class MimiCodec extends Codec {
  static graphs = { encoder: ["encoder", "fixed"], decoder: ["decoder", "fixed"],
    encoder_step: ["encoder", "step"], decoder_step: ["decoder", "step"] };
  label = "Mimi";

  missing(name) {
    return name.includes("step") ? "re-export with codec-export mimi --target web (it writes the step graphs)"
      : "export with --len for the fixed graphs";
  }

  /** Codes [K, ceil(N / frame)] of mono 24 kHz audio: the fixed encoder when the clip fits it
   * (zero-padded: Mimi is causal), else the step graphs. */
  async encode(pcm) {
    this.checkAudio(pcm);
    const frames = Math.ceil(pcm.length / this.frameSize);
    if (this.present.includes("encoder") && pcm.length <= metaInt(this.facts("encoder"), "samples")) {
      const codes = await this.encodeCall("encoder", window(pcm, 0, metaInt(this.facts("encoder"), "samples")));
      return sliceCodes(codes, 0, frames);
    }
    const s = this.stream();
    const head = await s.encodeStep(pcm);
    return concatCodes([head, await s.flushEncoder()], this.nCodebooks);
  }

  /** Audio [T * frame] of codes [K, T]: the fixed decoder when they fit it (code 0 pads the
   * tail, which a causal decoder's first samples do not see), else the step graphs. */
  async decode(codes) {
    codes = this.checkCodes(codes);
    const t = codes.shape[1];
    if (this.present.includes("decoder") && t <= metaInt(this.facts("decoder"), "frames")) {
      const audio = await this.decodeCall("decoder", sliceCodes(codes, 0, metaInt(this.facts("decoder"), "frames")));
      return audio.slice(0, t * this.frameSize);
    }
    const s = this.stream();
    return concatFloat([await s.decodeStep(codes), await s.flushDecoder()]);
  }

  /** A live stream through the step graphs (see MimiStream). */
  stream() {
    return new MimiStream(this);
  }
}

/** One step graph with its state: each `<name>_out` of a call is the `<name>_in` of the next.
 * (onnxruntime-web 1.30's wasm provider leaves pre-allocated CPU outputs unwritten, so ORT
 * allocates each step's state; nothing here relies on writing into given tensors.) */
class StepState {
  constructor(codec, g) {
    this.codec = codec;
    this.g = g;
    const outs = g.facts.outputs.slice(1);
    this.pairs = outs.map((o) => [o.name, o.name.replace(/_out$/, "_in")]);
    const ins = new Map(g.facts.inputs.slice(1).map((v) => [v.name, v]));
    if (outs.some((o) => !o.name.endsWith("_out")) || this.pairs.some(([, i]) => !ins.has(i)) ||
        ins.size !== this.pairs.length) {
      throw new CodecportError(`${g.facts.file}: its state inputs and outputs are not <name>_in/<name>_out pairs; ` +
        "re-export it");
    }
    this.inputs = [...ins.values()];
    this.reset();
  }

  reset() {
    this.state = Object.fromEntries(this.inputs.map((v) => [v.name, this.codec.tensor(v.type, zeros(v.type, v.shape), v.shape)]));
  }

  async call(x) {
    const v = this.g.facts.inputs[0];
    const data = v.type === "int64" ? toInt64(x) : x;
    const out = await this.codec.run(this.g, { [v.name]: this.codec.tensor(v.type, data, v.shape), ...this.state });
    this.state = Object.fromEntries(this.pairs.map(([o, i]) => [i, out[o]]));
    return out[this.g.facts.outputs[0].name].data;
  }
}

/** Streaming encode and decode through Mimi's step graphs, as the Python `MimiStream`:
 * `encodeStep(pcm)` takes any number of 24 kHz samples and returns the codes [K, t] of every
 * step completed so far (t may be 0); `decodeStep(codes)` takes any number of frames and returns
 * the audio of every completed step. Partial steps wait for the next call, or for
 * `flushEncoder()`/`flushDecoder()`, which pad them (zeros, code 0) and return the rest.
 * `reset()` starts a new stream. */
export class MimiStream {
  constructor(codec) {
    this.codec = codec;
    const side = ["encoder_step", "decoder_step"].find((g) => codec.present.includes(g));
    if (side === undefined) codec.facts("encoder_step"); // says what to do
    this.stepFrames = metaInt(codec.facts(side), "frames");
    this.stepSamples = this.stepFrames * codec.frameSize;
    this.latencyFrames = this.stepFrames - 1;
    this._steps = {};
    this._clear();
  }

  async _state(name) {
    if (!(name in this._steps)) this._steps[name] = new StepState(this.codec, await this.codec.graph(name));
    return this._steps[name];
  }

  _clear() {
    this._pcm = new Float32Array(0);
    this._codes = { data: new Int32Array(0), shape: [this.codec.nCodebooks, 0] };
  }

  reset() {
    for (const s of Object.values(this._steps)) s.reset();
    this._clear();
  }

  async encodeStep(pcm) {
    this.codec.checkAudio(pcm.length === 0 ? new Float32Array(1) : pcm);
    const step = await this._state("encoder_step");
    const buf = concatFloat([this._pcm, pcm]);
    const n = Math.floor(buf.length / this.stepSamples) * this.stepSamples;
    const parts = [];
    for (let i = 0; i < n; i += this.stepSamples) {
      // A copy, not a view: with ort.env.wasm.proxy the input's buffer moves to the worker.
      const codes = await step.call(buf.slice(i, i + this.stepSamples));
      parts.push({ data: toInt32(codes), shape: [this.codec.nCodebooks, this.stepFrames] });
    }
    this._pcm = buf.slice(n);
    return concatCodes(parts, this.codec.nCodebooks);
  }

  /** Codes of the buffered remainder, zero-padded to whole frames (moshi's padding). */
  async flushEncoder() {
    const rem = this._pcm.length;
    if (rem === 0) return concatCodes([], this.codec.nCodebooks);
    const codes = await this.encodeStep(new Float32Array(this.stepSamples - rem));
    return sliceCodes(codes, 0, Math.ceil(rem / this.codec.frameSize));
  }

  async decodeStep(codes) {
    codes = this.codec.checkCodes(codes);
    const step = await this._state("decoder_step");
    const buf = concatCodes([this._codes, codes], this.codec.nCodebooks);
    const t = buf.shape[1];
    const n = Math.floor(t / this.stepFrames) * this.stepFrames;
    const parts = [];
    for (let i = 0; i < n; i += this.stepFrames) {
      parts.push(new Float32Array(await step.call(sliceCodes(buf, i, i + this.stepFrames).data)));
    }
    this._codes = sliceCodes(buf, n, t);
    return concatFloat(parts);
  }

  /** Audio of the buffered remainder (padded with code 0, then trimmed). */
  async flushDecoder() {
    const rem = this._codes.shape[1];
    if (rem === 0) return new Float32Array(0);
    const k = this.codec.nCodebooks, pad = this.stepFrames - rem;
    const audio = await this.decodeStep({ data: new Int32Array(k * pad), shape: [k, pad] });
    return audio.slice(0, rem * this.codec.frameSize);
  }
}
