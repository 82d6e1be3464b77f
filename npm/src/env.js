/** Which JavaScript runtime this is: Node (worker_threads, files on disk) or a browser. */
export const IS_NODE = typeof process === 'object' && typeof process.versions?.node === 'string';
