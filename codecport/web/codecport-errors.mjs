// codecport.mjs's one error type: every failure says, in one line, what went wrong and what to do.

export class CodecportError extends Error {
  constructor(message) {
    super(message);
    this.name = "CodecportError";
  }
}
