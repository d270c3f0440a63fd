import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

import { failureReason, nvidiaGpu, tensorflowDevice } from '../../bench/gpu.js';
import { SPEC_BACKENDS } from '../helpers/backends.js';

const root = resolve(import.meta.dirname, '..', '..');
const tiny = join(root, 'spec', 'fixtures', 'hf', 'tiny-llama');

function bench(args: readonly string[]): Promise<{ code: number | null; lines: Record<string, unknown>[] }> {
  const child = spawn(process.execPath, [join(root, 'dist', 'bench', 'run.js'), 'gpu', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.resume();
  return new Promise((done) =>
    child.on('exit', (code) =>
      done({
        code,
        lines: stdout
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>),
      }),
    ),
  );
}

const small = ['--no-build', '--model-dir', tiny, '--batch', '2', '--seq', '8', '--reps', '1', '--lora', '4'];

describe('bench gpu', () => {
  it("reads where TensorFlow's device log placed the ops", () => {
    const made =
      '2026-11-27 03:10:16.9: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1616] Created device ' +
      '/job:localhost/replica:0/task:0/device:GPU:0 with 78917 MB memory:  -> device: 0, name: NVIDIA H100 80GB HBM3, ' +
      'pci bus id: 0000:00:07.0, compute capability: 9.0';
    expect(tensorflowDevice(`startup\n${made}\nmore`)).toBe('GPU:0 (NVIDIA H100 80GB HBM3)');
    const cpuOnly =
      "W dso_loader.cc:64] Could not load dynamic library 'libcuda.so.1'; dlerror: libcuda.so.1: cannot open shared object file";
    expect(tensorflowDevice(cpuOnly)).toBe('cpu');
  });

  it("names a failed side's error, not the last line of its stack", () => {
    const stderr = [
      '2026-11-27 07:55:01.1: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1616] Created device /job:localhost',
      'Error: Invalid TF_Status: 8',
      'Message: OOM when allocating tensor with shape[8192,49152]',
      '    at NodeJSKernelBackend.executeSingleOutput (node_modules/@tensorflow/tfjs-node-gpu/dist/nodejs_kernel_backend.js:1:1)',
      '    at Object.gradFunc (file:///repo/dist/lib/model/transformer.js:840:51)',
      '',
    ].join('\n');
    expect(failureReason(stderr)).toBe('Error: Invalid TF_Status: 8 | Message: OOM when allocating tensor with shape[8192,49152]');
    expect(failureReason('')).toBe('');
  });

  it('says plainly when there is no GPU, and runs nothing', async () => {
    if (nvidiaGpu() !== null) return; // a GPU machine runs the comparison (next case)
    const { code, lines } = await bench(small);
    expect(code).toBe(0);
    expect(lines).toEqual([{ bench: 'gpu', skipped: expect.stringContaining('no NVIDIA GPU') as unknown }]);
  });

  it('prints both sides and the ratios, each side naming the device it ran on', async () => {
    const backend = SPEC_BACKENDS.at(-1) as string;
    const { code, lines } = await bench([...small, '--allow-cpu', '--rxrl-backend', backend]);
    expect(code).toBe(0);
    const [head, rxrl, torch, summary] = lines;
    expect(head).toMatchObject({ bench: 'gpu', batch: 2, seq: 8, lora_rank: 4 });
    expect(rxrl).toMatchObject({ bench: 'gpu-rxrl', backend, batch: 2, seq: 8, lora_rank: 4, model: tiny });
    expect(rxrl.lora_train_tok_s).toBeGreaterThan(0);
    expect(rxrl.grad_tok_s).toBeGreaterThan(0);
    const gpu = nvidiaGpu();
    if (gpu === null) expect(rxrl.rxrl_device).toBe('cpu');
    expect(torch.bench).toBe('gpu-torch');
    // Without CUDA (or torch) PyTorch's side says why; with it, it ran on the GPU.
    if ('skipped' in torch) expect(typeof torch.skipped).toBe('string');
    else expect(torch.device).not.toBe('cpu');
    expect(summary).toMatchObject({ bench: 'gpu-summary', gpu: gpu?.name ?? null, rxrl_device: rxrl.rxrl_device });
    expect(Object.keys(summary.vs_torch as object).sort()).toEqual(['forward', 'grad', 'lora_train', 'train']);
  });
});
