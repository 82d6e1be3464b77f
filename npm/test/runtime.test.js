// Starting Python: when Pyodide cannot load NumPy, the load error says which file failed and what to do.
// Needs a local Pyodide distribution (RUVLLM_PYODIDE_DIST or ~/.cache/ruvllm/pyodide/314.0.1).
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { RuvLLM, RuvLLMError } from '../src/index.js';
import { DIST, HAVE_DIST } from './support/dist.js';

const ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
const MODEL = join(ROOT, 'models', 'smollm2-135m-instruct');
const SKIP = HAVE_DIST
  ? false
  : `no local Pyodide distribution at ${DIST}: set RUVLLM_PYODIDE_DIST to a Pyodide 314.0.1 folder with NumPy (docs/pyodide.md says how to make one)`;

/**
 * A copy of the local distribution (its files linked) whose lock file sends NumPy to a file that does
 * not exist. The path is absolute on purpose: for a relative one, Pyodide in Node falls back to its CDN,
 * and the test would then depend on whether this machine can reach it.
 */
async function distWithoutNumpy() {
  const dir = await mkdtemp(join(tmpdir(), 'ruvllm-no-numpy-'));
  for (const name of await readdir(DIST)) {
    if (name !== 'pyodide-lock.json' && !name.startsWith('numpy-')) await symlink(join(DIST, name), join(dir, name));
  }
  const lock = JSON.parse(await readFile(join(DIST, 'pyodide-lock.json'), 'utf8'));
  const missing = join(dir, 'missing', lock.packages.numpy.file_name);
  lock.packages.numpy.file_name = missing;
  await mkdir(join(dir, 'missing'));
  await writeFile(join(dir, 'pyodide-lock.json'), JSON.stringify(lock));
  return { dir, missing };
}

describe('Pyodide without NumPy', { skip: SKIP }, () => {
  test('the load error names the file that failed and says to set pyodide.indexURL', async () => {
    const { dir, missing } = await distWithoutNumpy();
    let error = null;
    try {
      // A fresh boot: a boot snapshot made from the whole distribution would hold NumPy already.
      const llm = await RuvLLM.load({ model: MODEL, pyodide: { indexURL: dir }, bootCache: false });
      await llm.dispose();
    } catch (e) {
      error = e;
    } finally {
      await rm(dir, { recursive: true });
    }
    assert.ok(error instanceof RuvLLMError, `expected a RuvLLMError, got ${error}`);
    assert.equal(error.type, 'load');
    assert.ok(error.message.includes(missing), error.message);
    assert.match(error.message, /^cannot load numpy into Pyodide from /);
    assert.match(error.message, /pass pyodide: \{ indexURL \} .* that holds NumPy.*docs\/pyodide\.md/s);
    assert.doesNotMatch(error.message, /ModuleNotFoundError/);
  });
});
