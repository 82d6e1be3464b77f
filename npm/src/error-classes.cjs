'use strict';
/**
 * The error classes of @ruvector/ruvllm, in CommonJS so that both entries hand out the same classes:
 * errors.js (the ES module) takes them from here, and so does index.cjs (`require`), so `instanceof`
 * holds whichever way a program loaded the package.
 */

/** @typedef {'download' | 'load' | 'inference' | 'context_full' | 'invalid_argument'} RuvLLMErrorType */

const ERROR_TYPES = Object.freeze(['download', 'load', 'inference', 'context_full', 'invalid_argument']);

class RuvLLMError extends Error {
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

class AbortError extends Error {
  constructor(message = 'The operation was aborted') {
    super(message);
    /** @type {'AbortError'} */
    this.name = 'AbortError';
  }
}

module.exports = { ERROR_TYPES, RuvLLMError, AbortError };
