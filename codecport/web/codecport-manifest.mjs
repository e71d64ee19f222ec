// A web folder's plans and graph entries (manifest.json), checked once as it loads: a damaged or
// lying manifest is one CodecportError saying to re-export, never a hang or a TypeError midway
// (a plan's step of 0 looped forever; a graph entry without inputs failed at the first call).

import { CodecportError } from "./codecport-errors.mjs";

const MODES = ["fixed", "chunked", "step", "windowed"];
const FITS = ["exact", "up-to", "masked"];
const COUNTS = ["frames", "samples", "window", "step"]; // positive wherever a plan has them
const OFFSETS = ["delay", "overlap"]; // zero or more

const isCount = (v, min) => Number.isSafeInteger(v) && v >= min;

/** A fact of the manifest (`what` names it) as a positive integer. */
export function positive(value, what) {
  const v = Number(value);
  if (!Number.isInteger(v) || v <= 0) throw new CodecportError(`${what} is not a positive integer; re-export the folder`);
  return v;
}

export function checkManifest(base, manifest) {
  const bad = (what) => {
    throw new CodecportError(`${base}manifest.json: ${what}; re-export it with codec-export ${manifest.codec} --target web`);
  };
  for (const side of ["encode", "decode"]) {
    for (const p of manifest.plans[side]) {
      if (typeof p?.graph !== "string") bad(`a plan of ${side} names no graph`);
      if (!MODES.includes(p.mode)) bad(`the ${p.graph} plan's mode ${JSON.stringify(p.mode)} is not one of ${MODES.join(", ")}`);
      if (p.fits != null && !FITS.includes(p.fits)) bad(`the ${p.graph} plan fits ${JSON.stringify(p.fits)}`);
      for (const k of COUNTS) if (k in p && !isCount(p[k], 1)) bad(`the ${p.graph} plan's ${k} is ${p[k]}, not a positive integer`);
      for (const k of OFFSETS) if (k in p && !isCount(p[k], 0)) bad(`the ${p.graph} plan's ${k} is ${p[k]}`);
      if (p.overlap != null && !(p.overlap < p.frames)) bad(`the ${p.graph} plan's overlap ${p.overlap} is not under its ${p.frames} frames`);
    }
  }
  for (const [name, f] of Object.entries(manifest.graphs)) {
    if (typeof f?.file !== "string" || !Array.isArray(f.inputs) || !Array.isArray(f.outputs)) {
      bad(`its entry of ${name} has no file, inputs and outputs`);
    }
    for (const a of [...f.inputs, ...f.outputs]) {
      if (typeof a?.name !== "string" || !Array.isArray(a.shape) || !a.shape.every((d) => isCount(d, 1))) {
        bad(`${name}'s ${a?.name} has no static shape`);
      }
    }
  }
  const l = manifest.plans.loudness;
  if (l != null && !(Array.isArray(l.stages) && l.stages.every(Array.isArray) && l.block_s > 0 && l.overlap >= 0 && l.overlap < 1)) {
    bad("its loudness plan is not one codec-export writes");
  }
}
