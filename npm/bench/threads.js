// npm run bench:threads: decoding on 1 thread against N threads (the kernel thread pool), stepped token
// by token in one process, so that a shared machine's changing speed (here it swings 2x within seconds,
// which drowns a 10% difference between two separate runs) falls on both alike.
//
//   RUVLLM_PYODIDE_DIST=... npm run bench:threads -- --model FILE.gguf|DIR [--threads 2|auto] [--tokens 64]
//        [--rounds 3] [--spin MICROSECONDS] [--versus relaxed] [--prefill TOKENS]
//
// One Pyodide loads the model twice: with the single-thread WebAssembly kernels (weights in Pyodide's
// heap) and with the pool (weights in the pool's memory). Each round generates greedily from both, one
// token from each in turn, and prints their time per token and the ratio. It also splits each side's
// products: their time as Python sees them (each matrix's __call__, wrapped here) and inside the kernels
// (the single-thread exports' calls; the pool's `run`), the difference being what the products cost on
// their way from Python.
// --spin sets the pool threads' spin budget (default: pool-protocol.js DEFAULT_SPIN_US; 0: sleep at once).
// --versus relaxed: the plain kernels against the relaxed SIMD build instead, both on one thread (Node 20
// needs --experimental-wasm-relaxed-simd: `npm run bench:simd` passes it).
// --versus plan: one thread without the decode plan (plan=False: the NumPy forward drives each product)
// against one thread with it (`npm run bench:plan`).
// --prefill TOKENS: prompts instead of decoding: each round, a prompt of TOKENS ids in chunks of 32 (as
// the engine prefills in Pyodide) on one side, then on the other, timed whole with the products' share.
import { dirname, basename, resolve } from 'node:path';
import { existsSync } from 'node:fs';
import { parseArgs } from 'node:util';

import { startKernels } from '../src/worker/kernels.js';
import { startPython } from '../src/worker/python.js';
import { startThreads } from '../src/worker/threads.js';
import { DIST } from '../test/support/dist.js';

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    threads: { type: 'string', default: '2' },
    tokens: { type: 'string', default: '64' },
    rounds: { type: 'string', default: '3' },
    spin: { type: 'string' },
    versus: { type: 'string', default: 'threads' },
    prefill: { type: 'string' },
    pyodide: { type: 'string', default: DIST },
  },
});
function fail(message) {
  console.error(message);
  process.exit(1);
}
for (const name of values.threads === 'auto' ? ['tokens', 'rounds'] : ['threads', 'tokens', 'rounds'])
  if (!/^[1-9][0-9]*$/.test(values[name])) fail(`--${name} must be a positive integer, got ${values[name]}`);
if (values.prefill !== undefined && !/^[1-9][0-9]*$/.test(values.prefill))
  fail(`--prefill must be a positive number of prompt tokens, got ${values.prefill}`);
if (values.spin !== undefined && !/^[0-9]+$/.test(values.spin))
  fail(`--spin must be a whole number of microseconds, got ${values.spin}`);
if (!values.model || !existsSync(values.model)) fail(`--model ${values.model}: no such GGUF file or model folder`);
if (!existsSync(resolve(values.pyodide, 'pyodide.asm.wasm')))
  fail(`no Pyodide distribution at ${values.pyodide}: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)`);
if (!['threads', 'relaxed', 'plan'].includes(values.versus))
  fail(`--versus must be threads, relaxed or plan, got ${values.versus}`);
// 'auto': the pool of every core (at most AUTO_MAX), each step on one thread or all, whichever measures faster
const ADAPTIVE = values.threads === 'auto';
const THREADS = ADAPTIVE ? 'auto' : Number(values.threads);
if (THREADS < 2) fail('--threads must be 2 or more (or auto): the pool is compared with one thread');
const SIMD = values.versus === 'relaxed';
const PLAN = values.versus === 'plan';

const { py } = await startPython({ indexURL: values.pyodide });
const kernels = await startKernels(py, 'wasm');
if (!kernels.exports) fail(`the WebAssembly kernels do not run here: ${kernels.reason}`);
/** host.py's exports of one build ('plain' or 'relaxed'), or the reason it does not run. */
function build(name) {
  const host = py.pyimport('ruvllm.host');
  const [exports, reason] = host.kernel_exports(name).toJs({ depth: 1 });
  host.destroy();
  return exports ?? fail(`the ${name} kernels do not run here: ${reason}`);
}
const spin = values.spin === undefined ? undefined : Number(values.spin);
const threads = SIMD || PLAN ? null : await startThreads(py, kernels, THREADS, { spin });
if (threads && !threads.api) fail(`no kernel thread pool: ${threads.reason}`);

// side 0 and side 1: their labels, and what their kernels' time is taken from (the single-thread
// exports' calls; the pool's run)
const labels = SIMD
  ? ['plain SIMD', 'relaxed SIMD']
  : PLAN
    ? ['no plan', 'the plan']
    : ['1 thread', ADAPTIVE ? `'auto' (${threads.count} threads)` : `${THREADS} threads`];
const where = SIMD || PLAN ? ['in the kernels', 'in the kernels'] : ['in the kernels', "in the pool's run"];
const inKernels = [0, 0];
function timed(f, side) {
  return (...args) => {
    const started = performance.now();
    const result = f(...args);
    inKernels[side] += performance.now() - started;
    return result;
  };
}
const timedExports = (exports, side) =>
  Object.fromEntries(Object.entries(exports).map(([name, f]) => [name, typeof f === 'function' ? timed(f, side) : f]));
if (threads) {
  threads.pool.run = timed(threads.pool.run.bind(threads.pool), 1);
  threads.pool.plan = timed(threads.pool.plan.bind(threads.pool), 1);
}

const model = resolve(values.model);
py.FS.mkdirTree('/host');
py.FS.mount(py.FS.filesystems.NODEFS, { root: dirname(model) }, '/host');
py.globals.set('path', `/host/${basename(model)}`);
py.globals.set('exports', timedExports(SIMD ? build('plain') : kernels.exports, 0));
py.globals.set(
  'other',
  SIMD ? timedExports(build('relaxed'), 1) : PLAN ? timedExports(kernels.exports, 1) : threads.api,
);
py.globals.set('simd', SIMD);
py.globals.set('versus_plan', PLAN);
py.globals.set('tokens', Number(values.tokens));
py.globals.set('prompt_tokens', Number(values.prefill ?? 0));
py.globals.set('kernel_ms', () => {
  const ms = [...inKernels];
  inKernels.fill(0);
  return JSON.stringify(ms);
});
py.runPython(`
import json, os, time
from ruvllm.api import Model
from ruvllm.quant import matrices
from ruvllm.quant.pool import PoolKernels
from ruvllm.quant.wasm import WasmKernels
from ruvllm.runtime.assembly import local_assembly
from ruvllm.runtime.engine import LoadOptions
from ruvllm.text.tokenizer import Tokenizer

def build(provider, plan):
    assembly = local_assembly(path)
    tokenizer_json, tokenizer_config, generation = assembly.tokenizer_files(merges=False)
    # raw text only: Pyodide's wheel has no jinja2 for a chat template
    tokenizer_config = {k: v for k, v in tokenizer_config.items() if k != "chat_template"}
    tokenizer = Tokenizer(tokenizer_json, tokenizer_config, *assembly.tokenizer_sources())
    assembly.options = LoadOptions(kernels="wasm", provider=provider, plan=plan)
    return Model.of(assembly, tokenizer, generation, "bench")

second = WasmKernels(other, "fast") if simd or versus_plan else PoolKernels(other, "fast")
providers = [WasmKernels(exports, "fast"), second]
one, two = build(providers[0], not versus_plan), build(providers[1], True)

in_products = [0.0, 0.0]  # per side: seconds in products, as Python sees them
def timed(call):
    def product(self, x):
        started = time.perf_counter()
        y = call(self, x)
        in_products[providers.index(self.provider)] += time.perf_counter() - started
        return y
    return product
for cls in (matrices.DenseMatrix, matrices.Int8Matrix):
    cls.__call__ = timed(cls.__call__)

from ruvllm.model import plan as decode_plan
in_plan = [0.0, 0.0]  # per side: seconds in the decode plan's forward, as Python sees it
def timed_plan(call):
    def forward(self, *args, **kwargs):
        started = time.perf_counter()
        y = call(self, *args, **kwargs)
        in_plan[[getattr(p, "memory", None) for p in providers].index(self.memory)] += time.perf_counter() - started
        return y
    return forward
decode_plan.DecodePlan.forward = timed_plan(decode_plan.DecodePlan.forward)

def stream(model):
    return model.generate("The history of the city is", max_tokens=tokens, temperature=0, ignore_eos=True)

def round_():
    """Both models step in turn; the first 4 steps (prefill, first tokens) are not counted."""
    a, b = stream(one), stream(two)
    spent = [0.0, 0.0]
    steps = 0
    while True:
        t0 = time.perf_counter()
        done = next(a, None) is None
        t1 = time.perf_counter()
        done = next(b, None) is None or done
        t2 = time.perf_counter()
        if done:
            return json.dumps({"spent": spent, "steps": steps - 4, "products": in_products, "plan": in_plan})
        steps += 1
        if steps == 4:
            in_products[:] = [0.0, 0.0]; in_plan[:] = [0.0, 0.0]; kernel_ms()
        if steps > 4:
            spent[0] += t1 - t0; spent[1] += t2 - t1

def prefill_round():
    """A prompt of prompt_tokens ids through each model in turn (chunks of 32, the last one's logits only)."""
    ids = [100 + i for i in range(prompt_tokens)]
    spent = []
    in_products[:] = [0.0, 0.0]; kernel_ms()
    for model in (one, two):
        cache = model.engine.new_cache()
        started = time.perf_counter()
        for start in range(0, prompt_tokens, 32):
            model.engine.forward(ids[start:start + 32], start, cache, last_only=True)
        spent.append(time.perf_counter() - started)
    return json.dumps({"spent": spent, "products": in_products})
`);
if (values.prefill !== undefined) {
  const round = py.globals.get('prefill_round');
  round(); // warm-up
  console.log(`${basename(model)}: ${labels[0]} against ${labels[1]}, a ${values.prefill}-token prompt each in turn`);
  for (let r = 1; r <= Number(values.rounds); r++) {
    const { spent, products } = JSON.parse(round());
    const inside = JSON.parse(py.globals.get('kernel_ms')());
    const ms = (s) => (1000 * s).toFixed(0);
    console.log(
      `round ${r}: ${labels[0]} ${ms(spent[0])} ms, ${labels[1]} ${ms(spent[1])} ms: ${(spent[0] / spent[1]).toFixed(2)}x; ` +
        `products as Python sees them ${ms(products[0])} ms on ${labels[0]} (${inside[0].toFixed(0)} ${where[0]}), ` +
        `${ms(products[1])} ms on ${labels[1]} (${inside[1].toFixed(0)} ${where[1]})`,
    );
  }
  await threads?.pool.dispose();
  process.exit(0);
}
const round = py.globals.get('round_');
round(); // warm-up
console.log(`${basename(model)}: ${labels[0]} against ${labels[1]}, stepped token by token`);
for (let r = 1; r <= Number(values.rounds); r++) {
  const { spent, steps, products, plan } = JSON.parse(round());
  const ms = (s) => ((1000 * s) / steps).toFixed(2);
  const inside = JSON.parse(py.globals.get('kernel_ms')()).map((t) => (t / steps).toFixed(2));
  // the decode plan's forward as Python sees it, where a side runs it (its kernels' time is run_plan's)
  const planned = (side) => (plan[side] > 0 ? `; the plan's forward ${ms(plan[side])} ms` : '');
  console.log(
    `round ${r}, ${steps} tokens: ${labels[0]} ${ms(spent[0])} ms/token, ${labels[1]} ${ms(spent[1])} ms/token: ` +
      `${(spent[0] / spent[1]).toFixed(2)}x; products as Python sees them ${ms(products[0])} ms on ` +
      `${labels[0]} (${inside[0]} ${where[0]}${planned(0)}), ${ms(products[1])} ms on ${labels[1]} ` +
      `(${inside[1]} ${where[1]}${planned(1)})`,
  );
}
if (threads) console.log(`calls by thread count: ${JSON.stringify(Object.fromEntries(threads.pool.dispatches))}`);
await threads?.pool.dispose();
