// The relaxed SIMD build (wasm/kernels-relaxed*.wasm) under test: Node 20 validates it only with a flag,
// so the tests that must see it chosen run again in a Node of their own, with RUVLLM_TEST_KERNELS=relaxed.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const RELAXED = new URL('../../wasm/kernels-relaxed.wasm', import.meta.url);
const FLAG = '--experimental-wasm-relaxed-simd';

/** True in the Node that runTestsRelaxed started. */
export const RELAXED_RUN = process.env.RUVLLM_TEST_KERNELS === 'relaxed';

/** Why the relaxed tests cannot run here, or false. */
export const NO_RELAXED = existsSync(RELAXED)
  ? false
  : 'no relaxed SIMD build (./build.sh kernels makes it with clang-19)';

/** Whether this Node validates the relaxed build as it is (Node 20: only with the flag). */
export const relaxedHere = () => WebAssembly.validate(readFileSync(RELAXED));

/**
 * Runs the tests of `file` (a test module's import.meta.url) whose names match `pattern` in a Node that
 * validates relaxed SIMD, and asserts that at least `least` ran and none failed.
 */
export function runTestsRelaxed(file, pattern, least) {
  const env = { ...process.env, RUVLLM_TEST_KERNELS: 'relaxed' };
  delete env.NODE_TEST_CONTEXT; // (set under node --test: the child would report to it, not in TAP)
  const flags = relaxedHere() ? [] : [FLAG];
  const run = spawnSync(process.execPath, [...flags, `--test-name-pattern=${pattern}`, fileURLToPath(file)], {
    env,
    encoding: 'utf8',
    timeout: 600000,
  });
  assert.equal(run.status, 0, run.stdout + run.stderr);
  assert.match(run.stdout, /^# fail 0$/m);
  const passed = Number(/^# pass (\d+)$/m.exec(run.stdout)?.[1]);
  assert.ok(passed >= least, `${passed} tests ran, not ${least}:\n${run.stdout}`);
}
