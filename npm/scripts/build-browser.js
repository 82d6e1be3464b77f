// Builds browser/: the facade and the worker as self-contained ES modules (our dependencies bundled in),
// so the package runs in a browser with or without a bundler. Node uses src/ directly.
// Pyodide itself is not bundled: the worker imports it at run time from the chosen indexURL.
import { rmSync } from 'node:fs';

import { build } from 'esbuild';

rmSync('browser', { recursive: true, force: true }); // no file of an older layout stays behind

await build({
  entryPoints: {
    index: 'src/index.js',
    'worker/main': 'src/worker/main.js',
    'worker/pool-worker': 'src/worker/pool-worker.js', // the kernel thread pool's threads (pool.js)
    'worker/gpu-worker': 'src/worker/gpu/gpu-worker.js', // the GPU's thread (gpu/client.js)
  },
  outdir: 'browser',
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: 'es2022',
  external: ['node:*', 'pyodide'], // reached only when running in Node
  legalComments: 'linked',
  logLevel: 'warning',
});
