// Fetching a web folder's files, every failure a CodecportError saying what to do.

import { CodecportError } from "./codecport-errors.mjs";

export async function fetchBytes(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new CodecportError(`${url}: could not be fetched (${e.message}); is the server up and the URL right?`);
  }
  if (!response.ok) throw new CodecportError(`${url}: HTTP ${response.status}; ${what}`);
  return response;
}

export async function fetchJson(url) {
  const response = await fetchBytes(url, "is the model folder's URL right? It must hold a codec-export " +
    "--target web folder");
  try {
    return JSON.parse(await response.text());
  } catch (e) {
    throw new CodecportError(`${url}: not JSON (${e.message}); re-run codec-export --target web`);
  }
}
