// The boot benchmark's one visit, shared by benchmarks/boot_node.mjs (Node) and benchmarks/browser/boot.html
// (Chromium, served at /bench/boot-timing.js): RuvLLM.load of the model, timed, then 8 greedy tokens.
//   boot_ms: from RuvLLM.load to Python ready (the 'runtime' progress event that carries info.boot);
//   plan_ms: to the first 'plan' step, the first step after the boot in every version of the worker (for
//   before/after); python_ms: the worker's own figure for the boot (info.boot.ms); load_ms: the whole load.

/**
 * Loads and times one model; the caller disposes of `llm` once it has the result.
 * @param {any} RuvLLM the package's class: npm/src/index.js under Node, the browser bundle in a page
 * @param {{ model: string, indexURL: string, bootCache?: string | null }} options bootCache: 'false'
 *   turns the boot snapshot off, any other string on; undefined or null: not given (older versions)
 * @returns {Promise<{ result: object, llm: any }>} result: { boot_ms, plan_ms, python_ms, load_ms, boot, text }
 */
export async function timedLoad(RuvLLM, { model, indexURL, bootCache }) {
  const started = performance.now();
  let bootMs = null;
  let planMs = null;
  const llm = await RuvLLM.load({
    model,
    pyodide: { indexURL },
    ...(bootCache == null ? {} : { bootCache: bootCache !== 'false' }),
    onProgress: (p) => {
      if (p.boot) bootMs = performance.now() - started;
      if (p.phase === 'plan' && planMs === null) planMs = performance.now() - started;
    },
  });
  const loadMs = performance.now() - started;
  let text = '';
  for await (const c of llm.generate('The capital of France is', { temperature: 0, maxTokens: 8 })) text += c.text;
  const boot = llm.info.boot ?? null; // versions before the boot snapshot have none
  const result = { boot_ms: bootMs, plan_ms: planMs, python_ms: boot?.ms ?? null, load_ms: loadMs, boot, text };
  return { result, llm };
}
