// The package from CommonJS: a fresh project without "type": "module" runs the README's require() snippet
// (the model replaced by a missing folder: the load reaches the worker and fails at once, no Pyodide).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const PACKAGE = resolve(fileURLToPath(new URL('..', import.meta.url)));
let project;

before(async () => {
  project = await mkdtemp(join(tmpdir(), 'ruvllm-cjs-'));
  await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'app', private: true })); // CommonJS
  await mkdir(join(project, 'node_modules', '@ruvector'), { recursive: true });
  await symlink(PACKAGE, join(project, 'node_modules', '@ruvector', 'ruvllm'), 'dir');
});
after(() => rm(project, { recursive: true, force: true }));

/** The README's CommonJS snippet: the ```js block that calls require('@ruvector/ruvllm'). */
async function readmeSnippet() {
  const readme = await readFile(join(PACKAGE, 'README.md'), 'utf8');
  const block = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]).find((b) => b.includes('require('));
  assert.ok(block, 'the README has a CommonJS snippet');
  return block;
}

async function node(file, code) {
  await writeFile(join(project, file), code);
  try {
    const { stdout, stderr } = await run(process.execPath, [file], { cwd: project });
    return { code: 0, stdout, stderr };
  } catch (error) {
    return { code: error.code, stdout: error.stdout, stderr: error.stderr };
  }
}

test("the README's CommonJS snippet runs in a CommonJS project, up to the load of the model", async () => {
  const missing = join(project, 'no-such-model');
  const snippet = (await readmeSnippet()).replace(/model: '[^']*'/, `model: ${JSON.stringify(missing)}`);
  const { code, stderr } = await node('index.js', snippet);
  assert.doesNotMatch(stderr, /Cannot use import statement|ERR_REQUIRE_ESM/);
  assert.equal(code, 1); // the snippet does not catch: the load error ends the process
  assert.match(stderr, /RuvLLMError: config\.json: cannot read .*no-such-model\/config\.json: no such file/);
});

test('require() gives RuvLLM.load and the ES module; errors are the same typed errors', async () => {
  const { code, stdout, stderr } = await node(
    'check.cjs',
    `const ruvllm = require('@ruvector/ruvllm');
(async () => {
  const api = await ruvllm.importModule();
  console.log(JSON.stringify(Object.keys(ruvllm).sort()), JSON.stringify(Object.keys(api).sort()));
  try {
    await ruvllm.RuvLLM.load({ model: 'm/', temprature: 0 });
  } catch (e) {
    console.log(e instanceof api.RuvLLMError, e instanceof ruvllm.RuvLLMError, e.type, e.message);
  }
})();
`,
  );
  assert.equal(code, 0, stderr);
  const [keys, check] = stdout.trim().split('\n');
  assert.equal(keys, '["AbortError","RuvLLM","RuvLLMError","importModule"] ["AbortError","RuvLLM","RuvLLMError"]');
  assert.match(
    check,
    /^true true invalid_argument options\.temprature is not an option of RuvLLM\.load; its options are: model, /,
  );
});

test('TypeScript in a CommonJS project imports the error classes (it was TS2305) and type-checks', async () => {
  const tsc = join(PACKAGE, '..', 'node_modules', '.bin', 'tsc');
  await writeFile(
    join(project, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { module: 'nodenext', strict: true, noEmit: true, types: [] } }),
  );
  await writeFile(
    join(project, 'main.ts'),
    `import { RuvLLM, RuvLLMError, AbortError, importModule } from '@ruvector/ruvllm';
export async function main(): Promise<string> {
  try {
    const llm = await RuvLLM.load({ model: './models/smollm2-135m-instruct/' });
    await llm.dispose();
    return 'loaded';
  } catch (error) {
    if (error instanceof RuvLLMError) return error.type;
    if (error instanceof AbortError) return error.message;
    const api = await importModule();
    return error instanceof api.RuvLLMError ? 'same class' : 'other';
  }
}
`,
  );
  try {
    await run(tsc, ['-p', 'tsconfig.json'], { cwd: project });
  } catch (error) {
    assert.fail(`tsc found errors:\n${error.stdout}${error.stderr}`);
  }
});
