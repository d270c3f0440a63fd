import { nativeBackendInstalled, type BackendName } from '../../lib/model/backend.js';

/**
 * The backends a spec runs on. wasm is the embedded default and always runs; tensorflow (the native addon) joins
 * wherever `npm run native` installed it, which `.ci/run` does, so CI exercises both.
 */
export const SPEC_BACKENDS: readonly BackendName[] = ['wasm', ...(nativeBackendInstalled() ? (['tensorflow'] as const) : [])];

/** {@link SPEC_BACKENDS} with the pure-JS reference backend first, for specs that compare kernels. */
export const ALL_BACKENDS: readonly BackendName[] = ['cpu', ...SPEC_BACKENDS];
