// Codes in the browser: what encode returns and decode takes, and the `.npz` files the Python
// runtime writes (`codec-run encode -o x.npz`, `Codes.save`), read with their fields.
//
// A codes object is {data: Int32Array, shape: [codebooks, frames]} (one channel, one time scale)
// with the fields that give the original audio back, as the Python `Codes` has them: numSamples
// and sampleRate (the original length and rate; absent for bare codes), loudnessDb (DAC), mode,
// chunkFrames, codec, preset, exportId.

import { CodecportError } from "./codecport-errors.mjs";

const FIELDS = { codec: "codec", preset: "preset", variant: "preset", export_id: "exportId",
  sample_rate: "sampleRate", num_samples: "numSamples", loudness_db: "loudnessDb", mode: "mode",
  chunk_frames: "chunkFrames" };

export function toInt32(values) {
  const out = new Int32Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = Number(values[i]);
  return out;
}

export function toInt64(values) {
  const out = new BigInt64Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = BigInt(values[i]);
  return out;
}

export function concatFloat(parts) {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Codes [K, T] side by side: parts of shape [K, t_i] -> [K, sum t_i]. */
export function concatCodes(parts, k) {
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
export function sliceCodes(codes, from, to) {
  const [k, t] = codes.shape;
  const n = to - from;
  const data = new Int32Array(k * n);
  for (let i = 0; i < k; i++) {
    data.set(codes.data.subarray(i * t + from, i * t + Math.min(to, t)), i * n);
  }
  return { data, shape: [k, n] };
}

/** Samples [from, from + n) of `x`, zeros outside it. */
export function window(x, from, n) {
  const out = new Float32Array(n);
  const lo = Math.max(0, from), hi = Math.min(x.length, from + n);
  if (hi > lo) out.set(x.subarray(lo, hi), lo - from);
  return out;
}

/** Python's `round`: halves to even (the Python runtime's length of a resampled clip). */
export function roundHalfEven(v) {
  const r = Math.round(v);
  return r - v === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** `x` cut or zero-padded to `n` samples. */
export function exactly(x, n) {
  return x.length >= n ? x.slice(0, n) : window(x, 0, n);
}

// ---- .npz -------------------------------------------------------------------------------------
// As the Python reader (runtime/npyfile.py): a member inflating past `MAX_RATIO` times its size
// and past `SMALL` bytes is a likely zip bomb; none past `MAX_BYTES`.
const MAX_RATIO = 200, SMALL = 64 << 20, MAX_BYTES = 1 << 30;

/** `bytes` inflated, refused once past `size` bytes (what the archive says it holds). */
async function inflate(bytes, size, name) {
  const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate-raw")).getReader();
  const out = new Uint8Array(size);
  let at = 0;
  try {
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      if (at + r.value.length > size) throw new CodecportError(`the .npz member ${name} inflates past the size it declares; re-encode the audio`);
      out.set(r.value, at);
      at += r.value.length;
    }
  } catch (e) {
    reader.cancel().catch(() => {});
    throw e instanceof CodecportError ? e : new CodecportError(`the .npz member ${name} does not inflate (${e.message}); re-encode the audio`);
  }
  if (at !== size) throw new CodecportError(`the .npz member ${name} is ${at} bytes, its archive says ${size}; re-encode the audio`);
  return out;
}

const CRC_TABLE = Uint32Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c;
});

function crc32(bytes) {
  let c = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) c = CRC_TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** name -> {bytes, method, size, crc} of every member of a zip archive, from its central
 * directory; offsets past the file (a damaged or lying archive) are one CodecportError. */
function zipMembers(buf) {
  try {
    return readDirectory(buf);
  } catch (e) {
    if (e instanceof RangeError) throw new CodecportError(`the .npz archive is damaged (${e.message}); re-encode the audio`);
    throw e;
  }
}

function readDirectory(buf) {
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let eocd = -1;
  for (let i = buf.length - 22; i >= Math.max(0, buf.length - 65557); i--) {
    if (v.getUint32(i, true) === 0x06054b50) { eocd = i; break; }
  }
  if (eocd < 0) throw new CodecportError("not a readable .npz archive (no zip directory); is it a codes file?");
  let count = v.getUint16(eocd + 10, true), at = v.getUint32(eocd + 16, true);
  if (at === 0xffffffff || count === 0xffff) { // zip64: the real numbers are in its own record
    const rec = Number(v.getBigUint64(eocd - 20 + 8, true));
    count = Number(v.getBigUint64(rec + 32, true));
    at = Number(v.getBigUint64(rec + 48, true));
  }
  const out = {};
  for (let e = 0; e < count; e++) {
    if (at + 46 > buf.length || v.getUint32(at, true) !== 0x02014b50) {
      throw new CodecportError("the .npz archive is damaged (a bad directory entry); re-encode the audio");
    }
    const method = v.getUint16(at + 10, true), crc = v.getUint32(at + 16, true);
    let size = v.getUint32(at + 20, true), local = v.getUint32(at + 42, true), full = v.getUint32(at + 24, true);
    const nameLen = v.getUint16(at + 28, true), extraLen = v.getUint16(at + 30, true);
    const commentLen = v.getUint16(at + 32, true);
    const name = new TextDecoder().decode(buf.subarray(at + 46, at + 46 + nameLen));
    for (let x = at + 46 + nameLen; x < at + 46 + nameLen + extraLen;) { // zip64 sizes and offset
      const id = v.getUint16(x, true), len = v.getUint16(x + 2, true);
      if (id === 1) {
        let f = x + 4;
        if (full === 0xffffffff) { full = Number(v.getBigUint64(f, true)); f += 8; } // uncompressed size first
        if (size === 0xffffffff) { size = Number(v.getBigUint64(f, true)); f += 8; }
        if (local === 0xffffffff) local = Number(v.getBigUint64(f, true));
      }
      x += 4 + len;
    }
    const start = local + 30 + v.getUint16(local + 26, true) + v.getUint16(local + 28, true);
    if (start + size > buf.length) throw new CodecportError(`the .npz member ${name} is truncated; re-encode the audio`);
    out[name] = { bytes: buf.subarray(start, start + size), method, size: full, crc };
    at += 46 + nameLen + extraLen + commentLen;
  }
  return out;
}

/** {shape, values} of a little-endian `.npy` of integers, floats or text. */
function readNpy(bytes, name) {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length < 10 || v.getUint8(0) !== 0x93 || new TextDecoder().decode(bytes.subarray(1, 6)) !== "NUMPY") {
    throw new CodecportError(`${name} is not a .npy array; not a codes file`);
  }
  const major = v.getUint8(6);
  const headerLen = major === 1 ? v.getUint16(8, true) : v.getUint32(8, true);
  const at = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.subarray(at, at + headerLen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const shape = (/'shape':\s*\(([^)]*)\)/.exec(header)?.[1] ?? "").split(",").filter((s) => s.trim()).map(Number);
  if (!descr || /'fortran_order':\s*True/.test(header)) {
    throw new CodecportError(`${name}: an array codecport.mjs does not read (${descr}); not a codes file`);
  }
  if (!shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new CodecportError(`${name}: its header says shape (${shape}); the file is damaged, re-encode the audio`);
  }
  const count = shape.reduce((a, b) => a * b, 1);
  // A copy (a Node Buffer's slice is a view of a shared pool): typed arrays need their own, aligned.
  const data = Uint8Array.prototype.slice.call(bytes, at + headerLen);
  const kind = descr.slice(1, 2), width = Number(descr.slice(2));
  const types = { i8: BigInt64Array, i4: Int32Array, i2: Int16Array, u2: Uint16Array, u1: Uint8Array, f8: Float64Array,
    f4: Float32Array };
  if (kind === "U") {
    if (!(width >= 1 && width * count * 4 <= data.length)) throw new CodecportError(`${name} is truncated; re-encode the audio`);
    const codes = new Uint32Array(data.buffer, 0, width * count);
    if (codes.some((c) => c > 0x10ffff)) throw new CodecportError(`${name} holds no text; the file is damaged, re-encode the audio`);
    return { shape, values: [String.fromCodePoint(...codes.filter((c) => c !== 0))] };
  }
  const Type = types[descr.slice(1)];
  if (!Type || descr[0] === ">") throw new CodecportError(`${name}: ${descr} arrays are not codes; not a codes file`);
  if (data.length < count * Type.BYTES_PER_ELEMENT) throw new CodecportError(`${name} is truncated; re-encode the audio`);
  return { shape, values: new Type(data.buffer, 0, count) };
}

/** The codes of a `.npz` written by codecport (or arrays saved with np.savez), as a codes
 * object with its fields: one channel, one time scale. */
export async function readCodes(bytes) {
  const buf = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const arrays = {};
  for (const [file, m] of Object.entries(zipMembers(buf))) {
    if (!file.endsWith(".npy")) continue;
    if (m.size > MAX_BYTES || (m.method !== 0 && m.size > SMALL && m.size > MAX_RATIO * m.bytes.length)) {
      throw new CodecportError(`${file} would inflate to ${m.size} bytes from ${m.bytes.length}; refusing a likely zip bomb`);
    }
    const raw = m.method === 8 ? await inflate(m.bytes, m.size, file) : m.method === 0 ? m.bytes : null;
    if (raw === null) throw new CodecportError(`${file}: compression ${m.method} is not one codecport.mjs reads`);
    if (crc32(raw) !== m.crc) throw new CodecportError(`the .npz member ${file} fails its CRC-32; the file is damaged, re-encode the audio`);
    arrays[file.slice(0, -4)] = readNpy(raw, file);
  }
  const key = ["codes_0", "codes", "arr_0"].find((k) => k in arrays);
  if (key === undefined) throw new CodecportError("the .npz holds no codes (no codes_0 array); not a codes file");
  if ("codes_1" in arrays || "arr_1" in arrays) {
    throw new CodecportError("these codes have several time scales; codecport.mjs runs codecs of one");
  }
  const a = arrays[key];
  const shape = a.shape.length === 3 ? a.shape : a.shape.length === 2 ? [1, ...a.shape] : null;
  if (!shape || shape[0] !== 1) {
    throw new CodecportError(`codes of shape [${a.shape}]: codecport.mjs decodes one channel, [1, codebooks, frames]`);
  }
  if (a.values instanceof Float32Array || a.values instanceof Float64Array || typeof a.values[0] === "string") {
    throw new CodecportError(`codes must be integers, got ${a.values.constructor.name}; not a codes file`);
  }
  const wide = a.values.find((c) => c < -(2 ** 31) || c >= 2 ** 31); // before they are cut to 32 bits
  if (wide !== undefined) throw new CodecportError(`codes must be integers in the codebook, found ${wide}; were they made by another model?`);
  const codes = { data: toInt32(a.values), shape: [shape[1], shape[2]] };
  for (const [field, name] of Object.entries(FIELDS)) {
    if (field in arrays && arrays[field].shape.length === 0) {
      const value = arrays[field].values[0];
      codes[name] = typeof value === "bigint" ? Number(value) : value;
    }
  }
  if ("length" in arrays && !("numSamples" in codes)) codes.numSamples = Number(arrays.length.values[0]);
  checkFields(codes);
  return codes;
}

const MODES = ["fixed", "chunked", "step", "whole", "windowed"]; // as runtime/codes.py

/** The fields of `codes` within what the Python runtime takes (runtime/codes.py _check_fields);
 * with the `model` ({sampleRate, frameSize}) that decodes them, the audio they ask for at most a
 * frame past what their frames hold (a lying length would size the output). */
export function checkFields(codes, model = null) {
  const bad = (what) => { throw new CodecportError(`${what}; the file is damaged, re-encode the audio`); };
  const int = (v, lo, hi) => Number.isSafeInteger(v) && v >= lo && v <= hi;
  if (codes.sampleRate != null && !int(codes.sampleRate, 1000, 1e6)) bad(`original sample rate ${codes.sampleRate} is not an audio rate`);
  if (codes.numSamples != null && !int(codes.numSamples, 1, 2 ** 40)) bad(`original length ${codes.numSamples} is impossible`);
  if ((codes.sampleRate == null) !== (codes.numSamples == null)) bad("codes need both the original sample rate and length, or neither");
  if (codes.loudnessDb != null && !(typeof codes.loudnessDb === "number" && codes.loudnessDb >= -300 && codes.loudnessDb <= 100)) {
    bad(`loudness ${codes.loudnessDb} dB is not a measured level`);
  }
  if (codes.mode != null && !MODES.includes(codes.mode)) bad(`mode ${JSON.stringify(codes.mode)} is not one of ${MODES.join(", ")}`);
  if (codes.chunkFrames != null && !int(codes.chunkFrames, 1, 2 ** 31)) bad(`chunk length ${codes.chunkFrames} frames is impossible`);
  if (model && codes.numSamples != null) {
    const t = codes.shape[1];
    const want = codes.sampleRate === model.sampleRate ? codes.numSamples : roundHalfEven(codes.numSamples * model.sampleRate / codes.sampleRate);
    if (want > (t + 1) * model.frameSize) bad(`${t} frames cannot be ${codes.numSamples} samples at ${codes.sampleRate} Hz`);
  }
}
