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
 * Errors are the ES module's own classes (error-classes.cjs holds them for both entries): `instanceof
 * RuvLLMError` and `instanceof AbortError` hold here too.
 */

const { RuvLLMError, AbortError } = require('./error-classes.cjs');

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
