/**
 * A stand-in for ruvllm.bridge.ModelLoader with the same JSON answers, for tests of how the worker moves a
 * model's bytes (src/worker/weights.js) without Pyodide. It asks for what py_src/ruvllm/runtime/assembly.py
 * asks for, less the documents a real model needs: a folder's model.safetensors.index.json (optional: the
 * shards it names, else model.safetensors), or the GGUF file `gguf` (a header of `ggufHeader` bytes);
 * each weight file's header (a safetensors file's says its length), then their data. It records what it
 * got: `headers` (size and bytes given) and `files` (size, bytes written, done).
 */
import assert from 'node:assert/strict';

const ok = (value) => JSON.stringify({ ok: value });
const failure = (type, message) => JSON.stringify({ error: { type, message } });

/**
 * @param {{ gguf?: string | null, ggufHeader?: number, refusePlan?: boolean }} [options] refusePlan: the
 *   last header is answered as a plan that cannot fit is
 */
export function fakeLoader({ gguf = null, ggufHeader = 64, refusePlan = false } = {}) {
  return {
    /** @type {string[] | null} */
    weights: gguf === null ? null : [gguf],
    /** @type {Record<string, { size: number, length: number }>} */
    headers: {},
    /** @type {Record<string, { size: number, got: number, done: boolean }>} */
    files: {},
    next() {
      if (this.weights === null) return ok({ name: 'model.safetensors.index.json', part: 'document', optional: true });
      const header = this.weights.find((name) => !(name in this.headers));
      if (header !== undefined) return ok({ name: header, part: 'header', optional: false });
      const data = this.weights.find((name) => !this.files[name]?.done);
      return ok(data === undefined ? null : { name: data, part: 'data', optional: false });
    },
    give_document(name, data) {
      const index = data == null ? null : JSON.parse(new TextDecoder().decode(data)); // (null crosses as undefined)
      this.weights = index === null ? ['model.safetensors'] : [...new Set(Object.values(index.weight_map))].sort();
      return ok(true);
    },
    header_size(name, size, head) {
      if (name === gguf) return ok(head.length >= ggufHeader ? ggufHeader : null);
      if (head.length < 8) return ok(null);
      return ok(Math.min(size, 8 + Number(new DataView(head.buffer, head.byteOffset, 8).getBigUint64(0, true))));
    },
    give_header(name, size, head) {
      this.headers[name] = { size, length: head.length };
      if (!this.weights.every((n) => n in this.headers)) return ok(null);
      return refusePlan ? failure('load', 'the plan does not fit') : ok({ compute: 'f32', total_bytes: 1 });
    },
    begin_file(request) {
      const { name, size } = JSON.parse(request);
      this.files[name] = { size, got: 0, done: false };
      return ok(size);
    },
    write(name, chunk) {
      assert.ok(chunk instanceof Uint8Array && chunk.constructor === Uint8Array, 'chunks are plain Uint8Arrays');
      this.files[name].got += chunk.length;
      return ok(this.files[name].got);
    },
    finish_file(request) {
      const { name } = JSON.parse(request);
      const file = this.files[name];
      if (file.got !== file.size) {
        return failure('download', `${name}: download incomplete: received ${file.got} of ${file.size} bytes`);
      }
      file.done = true;
      return ok({ bytes: file.got });
    },
  };
}
