/**
 * `ruvllm-js`: the Node command of @ruvector/ruvllm.
 *
 *   ruvllm-js generate MODEL --prompt TEXT [--chat] [--system TEXT] [--max-tokens N] [--temperature T]
 *                     [--seed S] [--ignore-eos] [--json] [--pyodide DIR] [--context-length N]
 *                     [--compute auto|f32|q8|q4] [--kernels auto|wasm|numpy] [--arithmetic exact|fast]
 *                     [--threads auto|N] [--no-plan] [--device auto|webgpu|cpu]
 *
 * With --json it prints exactly the object `ruvllm generate --json` prints on CPython. The Pyodide
 * distribution comes from --pyodide, else RUVLLM_PYODIDE_DIST, else the `pyodide` package (NumPy from
 * the CDN). Errors: exit code 1 and one line on stderr.
 */

import { parseArgs } from 'node:util';

import { RuvLLM, RuvLLMError } from './index.js';
import { toPython } from './protocol.js';

const USAGE = `usage: ruvllm-js generate MODEL --prompt TEXT [--chat] [--system TEXT] [--max-tokens N]
                 [--temperature T] [--seed S] [--ignore-eos] [--json] [--pyodide DIR] [--context-length N]
                 [--compute auto|f32|q8|q4] [--kernels auto|wasm|numpy] [--arithmetic exact|fast]
                 [--threads auto|N] [--no-plan] [--device auto|webgpu|cpu]`;

class UsageError extends Error {}

function number(value, name, integer) {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || (integer && !Number.isInteger(n))) {
    throw new UsageError(`argument --${name}: invalid ${integer ? 'int' : 'float'} value: '${value}'`);
  }
  return n;
}

export function parse(argv) {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        prompt: { type: 'string' },
        chat: { type: 'boolean', default: false },
        system: { type: 'string' },
        'max-tokens': { type: 'string' }, // unset: the library's defaults (Python's GenerationOptions)
        temperature: { type: 'string' },
        seed: { type: 'string' },
        'ignore-eos': { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
        pyodide: { type: 'string' },
        'context-length': { type: 'string' },
        compute: { type: 'string' }, // checked, with the other load options, by RuvLLM.load
        kernels: { type: 'string' },
        arithmetic: { type: 'string' },
        threads: { type: 'string' },
        device: { type: 'string' },
        'no-plan': { type: 'boolean', default: false }, // (parseArgs has no --no-X before Node 22.4)
        help: { type: 'boolean', default: false },
      },
    });
  } catch (error) {
    throw new UsageError(error.message);
  }
  const { values, positionals } = parsed;
  if (values.help) return { help: true };
  const [command, model, ...extra] = positionals;
  if (command !== 'generate') throw new UsageError(command ? `unknown command '${command}'` : 'a command is required');
  if (!model) throw new UsageError('the following arguments are required: MODEL');
  if (extra.length) throw new UsageError(`unexpected arguments: ${extra.join(' ')}`);
  if (values.prompt === undefined) throw new UsageError('the following arguments are required: --prompt');
  return {
    model,
    prompt: values.prompt,
    chat: values.chat,
    system: values.system,
    json: values.json,
    pyodide: values.pyodide ?? process.env.RUVLLM_PYODIDE_DIST,
    contextLength: number(values['context-length'], 'context-length', true),
    load: {
      compute: values.compute,
      kernels: values.kernels,
      arithmetic: values.arithmetic,
      threads: values.threads === 'auto' ? 'auto' : number(values.threads, 'threads', true),
      plan: !values['no-plan'],
      device: values.device,
    },
    options: {
      maxTokens: number(values['max-tokens'], 'max-tokens', true),
      temperature: number(values.temperature, 'temperature', false),
      seed: number(values.seed, 'seed', true),
      ignoreEos: values['ignore-eos'],
    },
  };
}

export async function main(argv = process.argv.slice(2), out = process.stdout, err = process.stderr) {
  let args;
  try {
    args = parse(argv);
  } catch (error) {
    err.write(`ruvllm-js: error: ${error.message} (see --help)\n`);
    return 2;
  }
  if (args.help) {
    out.write(`${USAGE}\n`);
    return 0;
  }
  let llm;
  try {
    llm = await RuvLLM.load({
      model: args.model,
      pyodide: args.pyodide ? { indexURL: args.pyodide } : undefined,
      contextLength: args.contextLength,
      ...args.load,
    });
    const messages = [
      ...(args.system !== undefined ? [{ role: 'system', content: args.system }] : []),
      { role: 'user', content: args.prompt },
    ];
    const promptIds = await llm.tokenize(args.chat ? messages : args.prompt);
    const text = [];
    const ids = [];
    /** @type {import('../types/index.d.ts').Chunk | null} */
    let last = null;
    for await (const chunk of llm.generate(promptIds, args.options)) {
      if (!args.json) out.write(chunk.text);
      text.push(chunk.text);
      ids.push(chunk.tokenId);
      last = chunk;
    }
    if (!args.json) {
      out.write('\n');
    } else {
      if (last === null) throw new Error('the generation ended without a chunk'); // the engine always yields one
      const { cachedTokens: _, ...stats } = last.stats; // what `ruvllm generate --json` prints, in its order
      const result = {
        text: text.join(''),
        tokenIds: ids,
        promptTokenIds: promptIds,
        finishReason: last.finishReason,
        stats,
      };
      out.write(`${JSON.stringify(toPython(result))}\n`);
    }
    return 0;
  } catch (error) {
    const message = error instanceof RuvLLMError ? error.message : `internal error: ${error.message}`;
    err.write(`ruvllm-js generate: error: ${message}\n`);
    return 1;
  } finally {
    await llm?.dispose();
  }
}
