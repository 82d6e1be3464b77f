// Perplexity through the WebAssembly kernels in Pyodide under Node: every token through the decoding
// products (chunks of 1), so the fast arithmetic's x quantization is what is measured. docs/kernels.md's
// arithmetic table comes from it.
//
//   RUVLLM_PYODIDE_DIST=... node --experimental-wasm-relaxed-simd bench/perplexity.js --model DIR|FILE.gguf \
//        --text ../benchmarks/data/eval.txt [--runs plain:fast,relaxed:fast,plain:exact] [--window 1024]
//
// Each run is BUILD:ARITHMETIC[:noplan]: the kernels' build ('plain', or 'relaxed': Node 20 validates it
// only with the flag above), the arithmetic ('fast' or 'exact'), and ':noplan' to drive each product from
// Python (plan=False) instead of the decode plan (which runs with the fast arithmetic). The model is a
// model folder or a GGUF file (text only: no chat template is read).
import { dirname, basename, resolve } from 'node:path';
import { existsSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { startKernels } from '../src/worker/kernels.js';
import { startPython } from '../src/worker/python.js';
import { DIST } from '../test/support/dist.js';

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    text: { type: 'string' },
    runs: { type: 'string', default: 'plain:fast,relaxed:fast,plain:exact' },
    window: { type: 'string', default: '1024' },
    pyodide: { type: 'string', default: DIST },
  },
});
function fail(message) {
  console.error(message);
  process.exit(1);
}
if (!values.model || !existsSync(values.model)) fail(`--model ${values.model}: no such model folder or GGUF file`);
if (!values.text || !existsSync(values.text)) fail(`--text ${values.text}: no such file`);
if (!/^[1-9][0-9]*$/.test(values.window)) fail(`--window must be a positive integer, got ${values.window}`);
const runs = values.runs.split(',').map((run) => run.split(':'));
for (const [build, arithmetic, plan = 'plan', ...rest] of runs)
  if (
    !['plain', 'relaxed'].includes(build) ||
    !['fast', 'exact'].includes(arithmetic) ||
    !['plan', 'noplan'].includes(plan) ||
    rest.length
  )
    fail(`--runs: each run is plain|relaxed:fast|exact[:noplan], got ${[build, arithmetic, plan, ...rest].join(':')}`);
if (!existsSync(resolve(values.pyodide, 'pyodide.asm.wasm')))
  fail(`no Pyodide distribution at ${values.pyodide}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`);

const { py } = await startPython({ indexURL: values.pyodide });
await startKernels(py, 'wasm');
const model = resolve(values.model);
const text = resolve(values.text);
const folder = !model.endsWith('.gguf');
py.FS.mkdirTree('/model');
py.FS.mount(py.FS.filesystems.NODEFS, { root: folder ? model : dirname(model) }, '/model');
py.globals.set('model_path', folder ? '/model' : `/model/${basename(model)}`);
py.FS.mkdirTree('/text');
py.FS.mount(py.FS.filesystems.NODEFS, { root: dirname(text) }, '/text');
py.globals.set('text_path', `/text/${basename(text)}`);
py.globals.set('window', Number(values.window));
py.runPython(`
import json, os, time
import ruvllm.host as host
from ruvllm.quant.wasm import WasmKernels
from ruvllm.runtime.assembly import local_assembly
from ruvllm.runtime.engine import LoadOptions
from ruvllm.text.tokenizer import Tokenizer
from ruvllm.tools.perplexity import perplexity

assembly = local_assembly(model_path)
tokenizer_json, settings, _ = assembly.tokenizer_files(merges=False)
settings = {k: v for k, v in settings.items() if k != "chat_template"}  # (Pyodide's wheel has no jinja2)
ids = Tokenizer(tokenizer_json, settings, *assembly.tokenizer_sources()).encode(open(text_path).read())

def measure(build, arithmetic, plan):
    label = f"{build} {arithmetic}{'' if plan else ', no plan'}"
    exports, why = host.kernel_exports(build)
    if exports is None:
        return f"{label}: the {build} kernels do not run here: {why}"
    provider = WasmKernels(exports, arithmetic)
    assembly = local_assembly(model_path)
    assembly.options = LoadOptions(kernels="wasm", provider=provider, plan=plan)
    engine = assembly.build()
    started = time.perf_counter()
    result = perplexity(engine, ids, window=window, chunk=1)
    seconds = time.perf_counter() - started
    ran = "the plan" if engine.decode_plan is not None else f"no plan: {engine.plan_note}"
    return f"{label} ({ran}): perplexity {result.perplexity:.4f} over {result.tokens} tokens ({seconds:.0f} s)"
`);
const measure = py.globals.get('measure');
console.log(`${basename(model)}, ${basename(text)}, windows of ${values.window}, every token decoded alone`);
for (const [build, arithmetic, plan = 'plan'] of runs) console.log(measure(build, arithmetic, plan === 'plan'));
