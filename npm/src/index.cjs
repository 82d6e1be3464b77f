'use strict';
/**
 * The CommonJS entry of @ruvector/ruvllm (what `require('@ruvector/ruvllm')` gives). The package is an
 * ES module, and Node 20 cannot require() one synchronously, so this door is asynchronous: `RuvLLM.load`
 * here imports the ES module on first use and answers the same model object.
 *
 *   const { RuvLLM } = require('@ruvector/ruvllm');
 *   async function main() {
 *     const llm = await RuvLLM.load({ model: './models/smollm2-135m-instruct/' });
 *     ...
 *   }
 *
 * RuvLLMError and AbortError here are CommonJS twins of the ES module's classes (which this door cannot
 * load synchronously): `error instanceof RuvLLMError` holds for the errors the package throws, as it
 * looks at the error's name (and, for a RuvLLMError, its type); the ES module's own classes are
 * `(await importModule()).RuvLLMError`.
 */

const ERROR_TYPES = ['download', 'load', 'inference', 'context_full', 'invalid_argument'];

class RuvLLMError extends Error {
  constructor(type, message) {
    super(message);
    this.name = 'RuvLLMError';
    this.type = ERROR_TYPES.includes(type) ? type : 'inference';
  }

  static [Symbol.hasInstance](value) {
    return value instanceof Error && value.name === 'RuvLLMError' && ERROR_TYPES.includes(value.type);
  }
}

class AbortError extends Error {
  constructor(message = 'The operation was aborted') {
    super(message);
    this.name = 'AbortError';
  }

  static [Symbol.hasInstance](value) {
    return value instanceof Error && value.name === 'AbortError';
  }
}

/** The ES module itself: { RuvLLM, RuvLLMError, AbortError }. */
function importModule() {
  return import('./index.js');
}

const RuvLLM = Object.freeze({
  /** RuvLLM.load of the ES module (see types/index.d.ts). */
  async load(options) {
    const api = await importModule();
    return api.RuvLLM.load(options);
  },
});

module.exports = { RuvLLM, importModule, RuvLLMError, AbortError };
