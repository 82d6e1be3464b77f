/**
 * Errors of @ruvector/ruvllm. Every failure a caller can act on is a RuvLLMError whose `type` says what
 * kind it is; an abort is an AbortError, as with fetch().
 */

/** @typedef {'download' | 'load' | 'inference' | 'context_full' | 'invalid_argument'} RuvLLMErrorType */

export const ERROR_TYPES = Object.freeze(['download', 'load', 'inference', 'context_full', 'invalid_argument']);

export class RuvLLMError extends Error {
  /**
   * @param {RuvLLMErrorType} type
   * @param {string} message
   */
  constructor(type, message) {
    super(message);
    /** @type {'RuvLLMError'} */
    this.name = 'RuvLLMError';
    this.type = ERROR_TYPES.includes(type) ? type : 'inference';
  }
}

export class AbortError extends Error {
  constructor(message = 'The operation was aborted') {
    super(message);
    /** @type {'AbortError'} */
    this.name = 'AbortError';
  }
}

/** A plain object that survives postMessage, and back. */
export function serializeError(error) {
  if (error instanceof AbortError) return { type: 'abort', message: error.message };
  if (error instanceof RuvLLMError) return { type: error.type, message: error.message };
  return { type: 'inference', message: `internal error: ${error?.message ?? String(error)}` };
}

/** The value of a Python bridge result ({"ok": value} or {"error": {type, message}}), or its error thrown. */
export function unwrap(json) {
  const result = JSON.parse(json);
  if (result.error) throw new RuvLLMError(result.error.type, result.error.message);
  return result.ok;
}

export function deserializeError({ type, message }) {
  return type === 'abort' ? new AbortError(message) : new RuvLLMError(type, message);
}
