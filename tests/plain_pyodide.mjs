// A plain Pyodide under Node, as a notebook user has one: no npm package, no worker. Boots the local
// distribution, installs wheels with micropip (emfs: paths, nothing fetched from a CDN), mounts host
// folders, runs Python code and prints its `result` as JSON. Driven by tests/test_pyodide_package.py.
//
// stdin: JSON {dist, wheels: [host paths], mounts: {pyodide path: host folder}, code}
// stdout: one JSON line {ok: result (Python's json.dumps of it)} or {error: message}
import { readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { pathToFileURL } from 'node:url';

const request = JSON.parse(readFileSync(0, 'utf8'));
const { loadPyodide } = await import(pathToFileURL(join(request.dist, 'pyodide.mjs')).href);
const say = (answer) => process.stdout.write(JSON.stringify(answer) + '\n');
let py;
try {
  const toStderr = (text) => process.stderr.write(text + '\n'); // stdout carries the answer only
  py = await loadPyodide({ indexURL: request.dist + '/', stdout: toStderr, stderr: toStderr });
  for (const [at, folder] of Object.entries(request.mounts ?? {})) {
    py.FS.mkdirTree(at);
    py.FS.mount(py.FS.filesystems.NODEFS, { root: folder }, at);
  }
  py.FS.mkdirTree('/tmp/wheels');
  const wheels = (request.wheels ?? []).map((path) => {
    const at = `/tmp/wheels/${basename(path)}`;
    py.FS.writeFile(at, readFileSync(path));
    return `emfs:${at}`;
  });
  await py.loadPackage('micropip', { messageCallback: toStderr });
  py.globals.set('wheels', py.toPy(wheels));
  await py.runPythonAsync('import micropip\nawait micropip.install(list(wheels))');
  await py.runPythonAsync(request.code);
  say({ ok: JSON.parse(py.runPython('import json; json.dumps(result)')) });
} catch (error) {
  say({ error: String(error.message ?? error) });
}
process.exit(0);
