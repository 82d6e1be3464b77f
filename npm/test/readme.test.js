// The README's JavaScript snippets, run as written in a fresh project that depends on the package (ES
// module ones as .mjs, the require() one as .cjs): the one change is the model's URL, made the local
// SmolLM2 folder (the README says a folder path works in Node). Pyodide comes from $RUVLLM_PYODIDE_DIST,
// as the README says it does in Node. Skipped, saying how to get one, without a local distribution.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { DIST, HAVE_DIST } from './support/dist.js';

const run = promisify(execFile);
const PACKAGE = resolve(fileURLToPath(new URL('..', import.meta.url)));
const MODEL = join(PACKAGE, '..', 'models', 'smollm2-135m-instruct');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;

/** The README's ```js blocks. */
async function snippets() {
  const readme = await readFile(join(PACKAGE, 'README.md'), 'utf8');
  return [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
}

describe("the README's snippets, as written", { skip: SKIP }, () => {
  let project;
  before(async () => {
    project = await mkdtemp(join(tmpdir(), 'ruvllm-readme-'));
    await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'app', private: true }));
    await mkdir(join(project, 'node_modules', '@ruvector'), { recursive: true });
    await symlink(PACKAGE, join(project, 'node_modules', '@ruvector', 'ruvllm'), 'dir');
  });
  after(() => rm(project, { recursive: true, force: true }));

  /** Runs a snippet (its model URL made the local folder); its exit code and output. */
  async function runSnippet(snippet, file) {
    const urls = snippet.match(/model: '[^']*'/g) ?? [];
    assert.ok(urls.length > 0, 'the snippet loads a model by URL');
    await writeFile(join(project, file), snippet.replaceAll(/model: '[^']*'/g, `model: ${JSON.stringify(MODEL)}`));
    const env = { ...process.env, RUVLLM_PYODIDE_DIST: DIST };
    try {
      const { stdout, stderr } = await run(process.execPath, [file], { cwd: project, env, maxBuffer: 1 << 24 });
      return { code: 0, stdout, stderr };
    } catch (error) {
      return { code: error.code, stdout: error.stdout, stderr: error.stderr };
    }
  }

  test('the first snippet streams a greedy chat answer and exits', async () => {
    const [first] = await snippets();
    assert.match(first, /import \{ RuvLLM \} from '@ruvector\/ruvllm'/);
    const { code, stdout, stderr } = await runSnippet(first, 'first.mjs');
    assert.equal(code, 0, stderr);
    assert.match(stdout, /The capital of France is Paris\./);
  });

  test('the CommonJS snippet streams the same answer from a CommonJS project', async () => {
    const snippet = (await snippets()).find((s) => s.includes('require('));
    const { code, stdout, stderr } = await runSnippet(snippet, 'index.cjs');
    assert.equal(code, 0, stderr);
    assert.match(stdout, /The capital of France is Paris\./);
  });

  test("the OpenAI shapes' snippet answers, streams and completes", async () => {
    const snippet = (await snippets()).find((s) => s.includes('chat.completions.create'));
    const { code, stdout, stderr } = await runSnippet(snippet, 'openai.mjs');
    assert.equal(code, 0, stderr);
    assert.match(stdout, /^The capital of France is Paris\. \{/); // the answer and its usage
    assert.match(stdout, /prompt_tokens: \d+/);
  });
});
