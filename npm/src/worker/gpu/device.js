/**
 * A WebGPU device for the decode plan: the browser's (navigator.gpu, in the worker too), or in Node the
 * `webgpu` package's (Dawn), installed beside this one. The device asks for the adapter's largest
 * buffers, so a model's matrices fit in as few bindings as the GPU allows.
 */

import { IS_NODE } from '../../env.js';

/** @type {GPU | null} Node's (Dawn's) GPU entry point, made once. */
let dawnGpu = null;

/**
 * The runtime's GPU entry point, or why there is none.
 * @returns {Promise<{ gpu: GPU | null, reason: string | null }>}
 */
async function entry() {
  if (!IS_NODE) {
    const gpu = globalThis.navigator?.gpu ?? null;
    return { gpu, reason: gpu ? null : 'this browser offers no WebGPU (navigator.gpu) in workers' };
  }
  let dawn;
  try {
    // (a name the type checker and the browser bundle do not follow: its types repeat the DOM's WebGPU)
    const name = 'webgpu';
    dawn = await import(name);
  } catch {
    return { gpu: null, reason: "Node has no WebGPU of its own: install the 'webgpu' package (Dawn) to use the GPU" };
  }
  Object.assign(globalThis, dawn.globals); // (GPUBufferUsage and the other constants the executor reads)
  // Dawn's entry point is kept for the process's life: collected, it takes its devices with it (a crash)
  dawnGpu ??= dawn.create([]);
  return { gpu: dawnGpu, reason: null };
}

/** A software adapter (a CPU emulating a GPU): right answers, slower than the CPU's own kernels. */
export function isSoftware(info) {
  const named = `${info.vendor} ${info.architecture} ${info.device} ${info.description}`;
  return info.isFallbackAdapter === true || /swiftshader|llvmpipe|lavapipe|software/i.test(named);
}

/**
 * A device, with what its adapter says of itself; or `device: null` and why not. `software`: whether a
 * software adapter will do (else one is refused, saying so).
 * @param {{ software?: boolean }} [options]
 * @returns {Promise<{ device: GPUDevice | null, adapter: object | null, reason: string | null }>}
 */
export async function requestGpu({ software = true } = {}) {
  const { gpu, reason } = await entry();
  if (!gpu) return { device: null, adapter: null, reason };
  const adapter = await gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter) return { device: null, adapter: null, reason: 'WebGPU offers no adapter here' };
  const info = adapter.info ?? {};
  if (!software && isSoftware(info))
    return {
      device: null,
      adapter: null,
      reason: `the only WebGPU adapter is a software one (${info.architecture || info.description}), slower than the CPU's kernels`,
    };
  const limits = adapter.limits;
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      maxBufferSize: limits.maxBufferSize,
      maxStorageBuffersPerShaderStage: limits.maxStorageBuffersPerShaderStage,
    },
  });
  const described = {
    vendor: info.vendor ?? '',
    architecture: info.architecture ?? '',
    device: info.device ?? '',
    description: info.description ?? '',
    features: [...adapter.features].sort(),
    maxBindingBytes: device.limits.maxStorageBufferBindingSize,
    maxBufferBytes: device.limits.maxBufferSize,
  };
  return { device, adapter: described, reason: null };
}
