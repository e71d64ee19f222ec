// Integrated loudness (ITU-R BS.1770) of mono audio, as codecport's Python runtime measures it
// (runtime/loudness.py, pyloudnorm's algorithm): the same K-weighting filters (their
// coefficients come from the folder's manifest, computed at export for the model's rate), run as
// scipy's lfilter runs them, 400 ms gating blocks overlapping by 75 %, the -70 LUFS absolute and
// -10 LU relative gates. Used to restore DAC's loudness on decoding, as the official decompress.

const MIN_LOUDNESS = -70;

/** scipy.signal.lfilter(b, a, x) in place, in its order of operations (direct form II transposed). */
function lfilter(b, a, x) {
  const n = Math.max(a.length, b.length);
  const bn = Array.from({ length: n }, (_, i) => (b[i] ?? 0) / a[0]);
  const an = Array.from({ length: n }, (_, i) => (a[i] ?? 0) / a[0]);
  const z = new Float64Array(n);
  for (let k = 0; k < x.length; k++) {
    const xn = x[k];
    const y = z[0] + bn[0] * xn;
    for (let i = 0; i < n - 2; i++) z[i] = z[i + 1] + xn * bn[i + 1] - y * an[i + 1];
    z[n - 2] = xn * bn[n - 1] - y * an[n - 1];
    x[k] = y;
  }
}

/** numpy's round: halves to even. */
function roundHalfEven(v) {
  const r = Math.round(v);
  return Math.abs(v % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** Loudness of `pcm` (Float32Array at `rate` Hz) in dB LUFS, floored at -70. `facts` is the
 * manifest's `plans.loudness`: {stages: [[gain, b, a], ...], block_s, overlap}. */
export function integratedLoudness(pcm, rate, facts) {
  const block = facts.block_s, step = 1 - facts.overlap;
  // As the whole-array measure pads a clip shorter than one gating block before filtering.
  const n = Math.max(pcm.length, Math.ceil(block * rate) + 1);
  const x = new Float64Array(n);
  x.set(pcm);
  for (const [gain, b, a] of facts.stages) {
    lfilter(b, a, x);
    for (let i = 0; i < n; i++) x[i] *= gain;
  }
  const sums = new Float64Array(n + 1); // sums[k]: the sum of squares of x[0:k]
  for (let i = 0; i < n; i++) sums[i + 1] = sums[i] + x[i] * x[i];
  const blocks = roundHalfEven((n / rate - block) / (block * step)) + 1;
  const z = new Float64Array(blocks);
  for (let j = 0; j < blocks; j++) {
    const lo = Math.trunc(block * (j * step) * rate), hi = Math.trunc(block * (j * step + 1) * rate);
    z[j] = (sums[Math.min(hi, n)] - sums[Math.min(lo, n)]) / (block * rate);
  }
  const level = (v) => -0.691 + 10 * Math.log10(v);
  const mean = (keep) => {
    let s = 0, c = 0;
    for (let j = 0; j < blocks; j++) if (keep(j)) { s += z[j]; c++; }
    return c ? s / c : null;
  };
  const gated = mean((j) => level(z[j]) >= MIN_LOUDNESS);
  if (gated === null) return MIN_LOUDNESS;
  const relative = level(gated) - 10;
  const kept = mean((j) => level(z[j]) > relative && level(z[j]) > MIN_LOUDNESS);
  if (kept === null) return MIN_LOUDNESS;
  return Math.max(level(kept), MIN_LOUDNESS);
}
