// benchmarks/tokenizer_bench.py in Pyodide under Node: the plain-Python tokenizer's timings (`run`) or ids
// (`ids`, for tests/test_pure_tokenizer.py) there.
//   node benchmarks/tokenizer_node.mjs PYODIDE_DIST run|ids INPUTS.json   (INPUTS.json: see tokenizer_bench.py)
// The repository is mounted at /ruvllm (only read); py_src is imported from it (no wheel needed).
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [dist, command, inputs] = process.argv.slice(2);
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
sys.argv = ["tokenizer_bench.py", "${command}", "/inputs/${path.basename(inputs)}"]
runpy.run_path("/ruvllm/benchmarks/tokenizer_bench.py", run_name="__main__")
`);
