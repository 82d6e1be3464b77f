// `npm pack` gives a package that works when installed into an empty project.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { DIST, HAVE_DIST } from './support/dist.js';

const run = promisify(execFile);
const PACKAGE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const ROOT = resolve(PACKAGE, '..');
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const PYTHON = process.env.RUVLLM_PYTHON || join(ROOT, '.venv', 'bin', 'python');

let project;

before(async () => {
  const out = await mkdtemp(join(tmpdir(), 'ruvllm-pack-'));
  const { stdout } = await run('npm', ['pack', '--silent', '--pack-destination', out], { cwd: PACKAGE });
  const tarball = join(out, stdout.trim().split('\n').at(-1));
  project = join(out, 'app');
  await run('mkdir', ['-p', project]);
  await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
  await run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', tarball], { cwd: project });
});

test('the installed package exports the API, its types, the wheel and the kernels', async () => {
  const script = "import('@ruvector/ruvllm').then((m) => console.log(JSON.stringify(Object.keys(m).sort())))";
  const { stdout } = await run(process.execPath, ['-e', script], { cwd: project });
  assert.deepEqual(JSON.parse(stdout), ['AbortError', 'RuvLLM', 'RuvLLMError']);
  const installed = join(project, 'node_modules', '@ruvector', 'ruvllm');
  for (const file of [
    'types/index.d.ts',
    'wheel/manifest.json',
    'wasm/kernels-shared.wasm',
    'bin/ruvllm-js.js',
    'browser/index.js',
    'browser/worker/main.js',
    // the relaxed SIMD pool build, where ./build.sh had clang-19 to make it
    ...(existsSync(new URL('../wasm/kernels-relaxed-shared.wasm', import.meta.url))
      ? ['wasm/kernels-relaxed-shared.wasm']
      : []),
  ])
    assert.ok(existsSync(join(installed, file)), file);
  assert.ok(existsSync(join(project, 'node_modules', '.bin', 'ruvllm-js')));
});

test(
  'the installed ruvllm-js gives the CPython greedy tokens',
  { skip: HAVE_DIST ? false : `no local Pyodide distribution at ${DIST} (see docs/pyodide.md)` },
  async () => {
    const args = [
      'generate',
      MODEL,
      '--prompt',
      'Once upon a time',
      '--temperature',
      '0',
      '--max-tokens',
      '16',
      '--ignore-eos',
      '--json',
    ];
    const { stdout } = await run(join(project, 'node_modules', '.bin', 'ruvllm-js'), [...args, '--pyodide', DIST], {
      cwd: project,
    });
    const expected = await run(PYTHON, ['-m', 'ruvllm', ...args]);
    assert.deepEqual(JSON.parse(stdout).token_ids, JSON.parse(expected.stdout).token_ids);
  },
);
