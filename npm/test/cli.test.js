// ruvllm-js: the command line, checked without loading a model.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { parse } from '../src/cli.js';

const BIN = fileURLToPath(new URL('../bin/ruvllm-js.js', import.meta.url));
const run = promisify(execFile);

test('arguments map onto load and generate options', () => {
  const args = parse([
    'generate',
    'm/',
    '--prompt',
    'Hi',
    '--chat',
    '--system',
    'Be brief',
    '--max-tokens',
    '12',
    '--temperature',
    '0',
    '--seed',
    '3',
    '--ignore-eos',
    '--json',
    '--pyodide',
    '/p',
    '--compute',
    'q4',
    '--kernels',
    'wasm',
    '--arithmetic',
    'fast',
    '--threads',
    '2',
    '--no-plan',
    '--device',
    'webgpu',
  ]);
  assert.deepEqual(args, {
    model: 'm/',
    prompt: 'Hi',
    chat: true,
    system: 'Be brief',
    json: true,
    pyodide: '/p',
    contextLength: undefined,
    load: { compute: 'q4', kernels: 'wasm', arithmetic: 'fast', threads: 2, plan: false, device: 'webgpu' },
    options: { maxTokens: 12, temperature: 0, seed: 3, ignoreEos: true },
  });
  assert.equal(parse(['generate', 'm/', '--prompt', 'Hi']).load.plan, true); // (the default)
});

async function usageError(args) {
  try {
    await run(process.execPath, [BIN, ...args]);
  } catch (error) {
    assert.equal(error.code, 2);
    const lines = error.stderr.trim().split('\n');
    assert.equal(lines.length, 1, error.stderr);
    return lines[0];
  }
  assert.fail('exit code 0');
}

test('a malformed command line is exit code 2 and one line on stderr', async () => {
  assert.equal(
    await usageError(['generate', 'm']),
    'ruvllm-js: error: the following arguments are required: --prompt (see --help)',
  );
  assert.equal(
    await usageError(['generate', 'm', '--prompt', 'x', '--max-tokens', 'many']),
    "ruvllm-js: error: argument --max-tokens: invalid int value: 'many' (see --help)",
  );
  assert.equal(
    await usageError(['generate', 'm', '--prompt', 'x', '--threads', 'all']),
    "ruvllm-js: error: argument --threads: invalid int value: 'all' (see --help)",
  );
  assert.equal(await usageError(['explain', 'm']), "ruvllm-js: error: unknown command 'explain' (see --help)");
  assert.match(
    await usageError(['generate', 'm', '--prompt', 'x', '--frobnicate']),
    /^ruvllm-js: error: Unknown option '--frobnicate'/,
  );
});

test('a missing model folder is exit code 1 and one line on stderr', async () => {
  try {
    await run(process.execPath, [
      BIN,
      'generate',
      '/nonexistent/model',
      '--prompt',
      'x',
      '--pyodide',
      '/nonexistent/pyodide',
    ]);
    assert.fail('exit code 0');
  } catch (error) {
    assert.equal(error.code, 1);
    const lines = error.stderr.trim().split('\n');
    assert.equal(lines.length, 1, error.stderr);
    assert.equal(
      lines[0],
      'ruvllm-js generate: error: config.json: cannot read /nonexistent/model/config.json: no such file',
    );
  }
});
