/**
 * Vitest setup file: TF.js's console warnings off in every spec file, as `lib/model/backend.ts` turns them off for
 * the library (its cpu backend otherwise greets each file with "Hi, looks like you are running TensorFlow.js in
 * Node.js"). Spec files that use the cpu backend directly never load that module.
 */
import * as tf from '@tensorflow/tfjs-core';

tf.env().set('PROD', true);
