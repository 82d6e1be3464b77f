// benchmarks/tokenizer_bench.py `run` in Pyodide under Node: the plain-Python tokenizer's timings there.
//   node benchmarks/tokenizer_node.mjs PYODIDE_DIST INPUTS.json   (INPUTS.json: tokenizer_bench.py prepare)
// The worktree is mounted read-only-in-practice at /ruvllm; py_src is imported from it (no wheel needed).
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [dist, inputs] = process.argv.slice(2);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { loadPyodide } = await import(pathToFileURL(path.join(path.resolve(dist), 'pyodide.mjs')).href);
const pyodide = await loadPyodide({ indexURL: path.resolve(dist) + path.sep });
await pyodide.loadPackage('numpy', { messageCallback: () => {} });
pyodide.FS.mkdirTree('/ruvllm');
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root }, '/ruvllm');
pyodide.FS.mkdirTree('/inputs');
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: path.dirname(path.resolve(inputs)) }, '/inputs');
pyodide.setStdout({ batched: (line) => process.stdout.write(`${line}\n`) });
await pyodide.runPythonAsync(`
import sys, runpy
sys.argv = ["tokenizer_bench.py", "run", "/inputs/${path.basename(inputs)}"]
runpy.run_path("/ruvllm/benchmarks/tokenizer_bench.py", run_name="__main__")
`);
