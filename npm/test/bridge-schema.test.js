// The bridge schema (src/bridge-schema.js) against the two sides it describes: the worker's source (every
// bridge call it makes names a call of the schema, and every call of the schema is made) and Python's
// ruvllm.bridge (its public methods and their parameters are exactly the schema's; the dataclasses
// answered as they are have exactly the schema's fields). The Python side runs RUVLLM_PYTHON (default:
// the repository's .venv) on this checkout's py_src.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, readdir } from 'node:fs/promises';
import { delimiter, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import {
  BRIDGE,
  FOLDER_FILES,
  MODELS_CACHE,
  PUBLIC_TYPES,
  SHAPES,
  WORKER_REQUESTS,
  camelCase,
  pythonNames,
} from '../src/bridge-schema.js';
import { PYTHON_NAMES, REQUESTS, fromPython, toPython } from '../src/protocol.js';

const PACKAGE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const ROOT = resolve(PACKAGE, '..');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');
const run = promisify(execFile);

/** Every call of the schema as 'Owner.method' -> its entry. */
const CALLS = new Map(
  Object.entries(BRIDGE).flatMap(([owner, calls]) =>
    Object.entries(calls).map(([method, call]) => [`${owner}.${method}`, call]),
  ),
);
const byMethod = (method) => [...CALLS.keys()].filter((key) => key.endsWith(`.${method}`));

/** Every .js file under src/, as [path relative to the package, text]. */
async function sources() {
  const src = join(PACKAGE, 'src');
  const files = (await readdir(src, { recursive: true })).filter((f) => f.endsWith('.js')).sort();
  return Promise.all(files.map(async (f) => [`src/${f}`, await readFile(join(src, f), 'utf8')]));
}

/**
 * The bridge calls made in the source: callBridge(target, 'method', ...), main.js's answer('method', ...)
 * (a handler that is one callBridge), and methods called on a bridge proxy directly (`bridge`, `loader`,
 * `state.engine`: PyProxy's own methods, destroy and the camelCase ones, are not Python's). Each as
 * { method, where, how }; `dynamic` lists the callBridge calls whose method is not a literal.
 */
async function callsInSource() {
  const found = [];
  const dynamic = [];
  for (const [path, text] of await sources()) {
    const at = (index) => `${path}:${text.slice(0, index).split('\n').length}`;
    for (const m of text.matchAll(/(?<!function )\bcallBridge\(\s*[\w.]+\s*,\s*('(\w+)')?/g)) {
      if (m[2]) found.push({ method: m[2], where: at(m.index), how: 'callBridge' });
      else dynamic.push(at(m.index));
    }
    for (const m of text.matchAll(/(?<![\w.])answer\(\s*'(\w+)'/g))
      found.push({ method: m[1], where: at(m.index), how: 'callBridge' });
    for (const m of text.matchAll(/(?<![\w.])(bridge|loader|state\.engine)\??\.(\w+)\(/g)) {
      if (m[2] === 'destroy' || /[A-Z]/.test(m[2])) continue;
      found.push({ method: m[2], where: at(m.index), how: 'proxy' });
    }
  }
  return { found, dynamic };
}

test("every bridge call in the worker's source names a call of the schema", async () => {
  const { found, dynamic } = await callsInSource();
  assert.ok(found.length > 30, `only ${found.length} bridge calls found: the patterns no longer match the source`);
  for (const { method, where, how } of found) {
    const owners = byMethod(method);
    assert.equal(
      owners.length,
      1,
      `${where}: ${method} is ${owners.length ? 'ambiguous' : 'no call of bridge-schema.js'}`,
    );
    // callBridge unwraps a JSON answer: a call that hands over a Python object is called directly
    if (how === 'callBridge') assert.ok(!CALLS.get(owners[0]).hands, `${where}: ${method} hands over an object`);
  }
  // the one callBridge with a method from a variable: main.js's answer(method), whose uses are counted above
  assert.deepEqual(
    dynamic.map((where) => where.replace(/:\d+$/, '')),
    ['src/worker/main.js'],
    `callBridge with a method that is not a literal: ${dynamic.join(', ')}`,
  );
});

test('every call of the schema is made somewhere in src/', async () => {
  const made = new Set((await callsInSource()).found.map((c) => c.method));
  const unused = [...CALLS.keys()].filter((key) => !made.has(key.slice(key.lastIndexOf('.') + 1)));
  assert.deepEqual(unused, [], `calls of bridge-schema.js that src/ never makes: ${unused.join(', ')}`);
});

test("the schema's calls are ruvllm.bridge's public methods, with Python's parameter names", async (t) => {
  if (!existsSync(PYTHON)) {
    t.skip(`no Python at ${PYTHON}: set RUVLLM_PYTHON to one with ruvllm's dependencies (./build.sh setup)`);
    return;
  }
  const script = String.raw`
import dataclasses, importlib, inspect, json, sys
import ruvllm.bridge as bridge

def describe(fn):
    params = []
    for p in list(inspect.signature(inspect.unwrap(fn)).parameters.values()):
        if p.name != "self":
            params.append(("*" if p.kind is p.VAR_POSITIONAL else "") + p.name)
    return {"params": params, "json": hasattr(fn, "__wrapped__")}

out = {"ruvllm.bridge": {n: describe(f) for n, f in vars(bridge).items()
                         if inspect.isfunction(f) and f.__module__ == bridge.__name__ and not n.startswith("_")}}
for cls in (bridge.ModelLoader, bridge.EngineHandle):
    out[cls.__name__] = {n: describe(f) for n, f in vars(cls).items() if inspect.isfunction(f) and not n.startswith("_")}
dataclasses_ = {}
for path in json.loads(sys.argv[1]):
    module, name = path.rsplit(".", 1)
    dataclasses_[path] = [f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))]
import ruvllm.host as host
from ruvllm.files import layout
folder = {"config": layout.CONFIG, "tokenizer": layout.TOKENIZER, "tokenizerConfig": layout.TOKENIZER_CONFIG,
          "generationConfig": layout.GENERATION_CONFIG, "weights": layout.WEIGHTS, "index": layout.WEIGHTS_INDEX}
print(json.dumps({"methods": out, "dataclasses": dataclasses_, "models_cache": host.MODELS_CACHE, "folder": folder}))
`;
  const wanted = Object.values(SHAPES)
    .map((s) => s.dataclass)
    .filter(Boolean);
  const env = {
    ...process.env,
    PYTHONPATH: [join(ROOT, 'py_src'), process.env.PYTHONPATH].filter(Boolean).join(delimiter),
  };
  const { stdout } = await run(PYTHON, ['-c', script, JSON.stringify(wanted)], { env });
  const python = JSON.parse(stdout);
  for (const [owner, methods] of Object.entries(python.methods)) {
    assert.deepEqual(Object.keys(methods).sort(), Object.keys(BRIDGE[owner] ?? {}).sort(), `${owner}'s methods`);
    for (const [name, { params, json }] of Object.entries(methods)) {
      const call = BRIDGE[owner][name];
      const args = Object.entries(call.args).map(([arg, type]) => (type.startsWith('*') ? `*${arg}` : arg));
      assert.deepEqual(params, args, `${owner}.${name}'s parameters`);
      assert.equal(json, !call.hands, `${owner}.${name} ${json ? 'answers JSON' : 'hands over an object'}`);
    }
  }
  assert.deepEqual(Object.keys(python.methods).sort(), Object.keys(BRIDGE).sort());
  for (const shape of Object.values(SHAPES).filter((s) => s.dataclass)) {
    assert.deepEqual(Object.keys(shape.fields), python.dataclasses[shape.dataclass], `${shape.dataclass}'s fields`);
  }
  assert.equal(python.models_cache, MODELS_CACHE, "host.py's Cache API store is the worker's");
  assert.deepEqual(python.folder, FOLDER_FILES, "files/layout.py's folder is the worker's and the page's");
});

test('the public types that restate a shape have its fields, by their JavaScript names', async () => {
  const types = await readFile(join(ROOT, 'npm', 'types', 'index.d.ts'), 'utf8');
  for (const [name, { shape, omits = [] }] of Object.entries(PUBLIC_TYPES)) {
    const start = types.indexOf(`export interface ${name} {`);
    assert.ok(start >= 0, `types/index.d.ts has no interface ${name}`);
    const body = types.slice(start, types.indexOf('\n}\n', start));
    const declared = [...body.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1]);
    const wire = Object.keys(SHAPES[shape].fields)
      .filter((field) => !omits.includes(field))
      .map((field) => (SHAPES[shape].verbatim ? field : camelCase(field)));
    assert.deepEqual(declared.sort(), wire.sort(), `${name} (types/index.d.ts) against the shape ${shape}`);
  }
});

test("the schema's types name shapes that exist", () => {
  const known = new Set([...Object.keys(SHAPES), 'ModelLoader', 'EngineHandle']);
  const named = (type) => [...type.matchAll(/\b[A-Z][A-Za-z]+\b/g)].map((m) => m[0]).filter((n) => n !== 'Record');
  const types = [
    ...Object.entries(SHAPES).flatMap(([name, s]) => Object.values(s.fields).map((type) => [name, type])),
    ...[...CALLS].flatMap(([key, call]) => [...Object.values(call.args), call.returns].map((type) => [key, type])),
  ];
  for (const [where, type] of types) {
    // a description may name Python things (AdapterSet.describe, OpenAI); the shape names are whole words
    for (const name of named(type.split('(')[0])) assert.ok(known.has(name), `${where}: ${name} is no shape`);
  }
});

test('the name table is made from the schema: each field with an underscore, as camelCase, both ways', () => {
  assert.deepEqual(PYTHON_NAMES, pythonNames());
  for (const [js, py] of Object.entries(PYTHON_NAMES)) assert.equal(js, camelCase(py));
  // a few of each kind, as the JavaScript API documents them
  for (const [js, py] of [
    ['maxTokens', 'max_tokens'],
    ['budgetBytes', 'budget_bytes'],
    ['decodeTokS', 'decode_tok_s'],
    ['weightBytesByForm', 'weight_bytes_by_form'],
    ['logProbBefore', 'log_prob_before'],
    ['promptTokenIds', 'prompt_token_ids'],
  ])
    assert.equal(PYTHON_NAMES[js], py);
  const request = { promptIds: [1], options: { maxTokens: 2, topK: undefined }, kv: { hotTokens: 3 } };
  assert.deepEqual(toPython(request), { prompt_ids: [1], options: { max_tokens: 2 }, kv: { hot_tokens: 3 } });
  assert.deepEqual(fromPython({ stats: { ttft_ms: 1, cached_tokens: 0 } }), { stats: { ttftMs: 1, cachedTokens: 0 } });
});

test('the answers read with their Python names stay so: no field of theirs is in the name table', () => {
  const pythonSide = new Set(Object.values(PYTHON_NAMES));
  const verbatimAnswers = [...CALLS.values()].map((c) => SHAPES[c.returns]).filter((s) => s?.verbatim);
  assert.ok(verbatimAnswers.length > 0);
  for (const shape of verbatimAnswers)
    for (const field of Object.keys(shape.fields)) assert.ok(!pythonSide.has(field), `${field} would be renamed`);
});

test("the worker's request types are the schema's, and the facade sends no other", async () => {
  assert.deepEqual(REQUESTS, Object.keys(WORKER_REQUESTS));
  const main = await readFile(join(PACKAGE, 'src', 'worker', 'main.js'), 'utf8');
  const handlers = main.slice(main.indexOf('const HANDLERS = {'), main.indexOf('\n};', main.indexOf('const HANDLERS')));
  const handled = [...handlers.matchAll(/^ {2}(\w+)[:,]/gm)].map((m) => m[1]);
  // abort is answered on arrival (onMessage), never queued to a handler
  assert.deepEqual(handled.sort(), REQUESTS.filter((r) => r !== 'abort').sort());
  const facade = await readFile(join(PACKAGE, 'src', 'index.js'), 'utf8');
  const sent = new Set([...facade.matchAll(/(?<!error: )\{\s*type: '(\w+)'/g)].map((m) => m[1]));
  // not requests: an error event the facade makes itself (its error's type excluded above), the Worker's option
  for (const type of sent)
    if (type !== 'error' && type !== 'module') assert.ok(REQUESTS.includes(type), `the facade sends ${type}`);
  for (const type of REQUESTS) assert.ok(sent.has(type), `the facade never sends ${type}`);
});
