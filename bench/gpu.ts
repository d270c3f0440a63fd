/**
 * `npm run bench -- gpu [--reps 3] [--batch 16] [--seq 48] [--lora 16] [--model-dir DIR] [--no-build]
 * [--allow-cpu] [--rxrl-backend tensorflow]`
 *
 * rxrl's SmolLM2 training steps on an NVIDIA GPU beside PyTorch's on the same GPU, in one run:
 *
 * 1. asks `nvidia-smi` for the GPU (name, driver, memory); without one it prints `{"bench":"gpu","skipped":…}` and
 *    stops, unless `--allow-cpu` (which runs the rest anyway, to check the bench itself on a machine without a GPU);
 * 2. builds the GPU backend, `npm run native -- --gpu` (CUDA 11 and cuDNN 8 from NVIDIA's PyPI wheels where the system
 *    has only the driver; idempotent), unless `--no-build`;
 * 3. runs `npm run bench -- hf` for rxrl in a child process with TensorFlow's device log on, so the row says where
 *    TensorFlow placed its ops (`rxrl_device`: `GPU:0 (<name>)`, or `cpu`): forward, forward + backward, the full
 *    fine-tuning step (the trainer's Adam over all 134.5 M weights) and the LoRA step (rank `--lora`, every
 *    projection), at `--batch` rows × `--seq` tokens (default the shape of a 16-completion batch);
 * 4. runs `bench/torch_hf.py --device cuda` for PyTorch (float32, eager attention; LoRA through PEFT);
 * 5. prints `{"bench":"gpu-summary",…}`: the GPU, each side's device, and rxrl ÷ PyTorch tokens per second for each
 *    measurement (`train` is full fine-tuning, `lora_train` LoRA; above 1: rxrl is faster).
 *
 * A GPU machine with no network, or with a CUDA other than 11, gets the backend from `scripts/gpu_offline.sh`
 * (packed here, staged there) and runs this with `--no-build`, as the README's H100 table was measured.
 *
 * @packageDocumentation
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { defaultModelDir } from './hf.js';
import { ratio, runTorchHf } from './_torch.js';
import { benchArgs } from './_args.js';

interface Options {
  readonly reps: number;
  readonly batch: number;
  readonly seq: number;
  readonly lora: number;
  readonly modelDir: string | undefined;
  readonly build: boolean;
  readonly allowCpu: boolean;
  readonly rxrlBackend: string;
}

function parse(args: readonly string[]): Options {
  const { value, int, flag } = benchArgs(args);
  return {
    reps: int('reps', 3),
    batch: int('batch', 16),
    seq: int('seq', 48),
    lora: int('lora', 16),
    modelDir: value('model-dir') ?? defaultModelDir(),
    build: !flag('no-build'),
    allowCpu: flag('allow-cpu'),
    rxrlBackend: value('rxrl-backend') ?? 'tensorflow',
  };
}

/** The first GPU `nvidia-smi` lists (`name`, `driver`, `memory`), or null when there is none or no `nvidia-smi`. */
export function nvidiaGpu(): { name: string; driver: string; memory: string } | null {
  const run = spawnSync('nvidia-smi', ['--query-gpu=name,driver_version,memory.total', '--format=csv,noheader'], { encoding: 'utf8' });
  const first = run.status === 0 ? run.stdout.trim().split('\n')[0] : undefined;
  if (!first) return null;
  const [name = '', driver = '', memory = ''] = first.split(',').map((s) => s.trim());
  return { name, driver, memory };
}

/** Where TensorFlow's device log says it placed its ops: `GPU:<n> (<name>)`, or `cpu` when it made no GPU device. */
export function tensorflowDevice(log: string): string {
  const made = /Created device \/job:localhost\/replica:0\/task:0\/device:GPU:(\d+).*?name: ([^,]+)/.exec(log);
  return made ? `GPU:${made[1]} (${made[2].trim()})` : 'cpu';
}

/**
 * Why a child bench failed, from its stderr: the last lines that are neither a stack frame nor TensorFlow's own
 * timestamped log (a thrown error's name and message, e.g. `Error: Invalid TF_Status: 8` and `Message: OOM …`).
 */
export function failureReason(stderr: string, lines = 3): string {
  const said = stderr.split('\n').filter((l) => l.trim() !== '' && !/^\s+at /.test(l) && !/^\d{4}-\d\d-\d\d \d/.test(l));
  return said
    .slice(-lines)
    .map((l) => l.trim())
    .join(' | ');
}

/** Builds the GPU backend (`scripts/native.sh --gpu`), everything it prints on stderr (stdout is the bench's JSON). */
function build(): Promise<void> {
  const script = fileURLToPath(new URL('../../scripts/native.sh', import.meta.url));
  const child = spawn('bash', [script, '--gpu'], { stdio: ['ignore', 2, 'inherit'] });
  return new Promise((done, fail) =>
    child.on('exit', (code) => (code === 0 ? done() : fail(new Error(`bench gpu: npm run native -- --gpu exited with ${code}`)))),
  );
}

/** rxrl's row: `bench hf` in a child process with TensorFlow's device log on, and the device it reports. */
async function rxrlSide(options: Options): Promise<Record<string, unknown>> {
  const runner = fileURLToPath(new URL('./run.js', import.meta.url));
  const args = [runner, 'hf', '--backends', options.rxrlBackend, '--no-torch', '--reps', String(options.reps)];
  args.push('--batch', String(options.batch), '--seq', String(options.seq), '--lora', String(options.lora));
  if (options.modelDir) args.push('--model-dir', options.modelDir);
  const child = spawn(process.execPath, ['--expose-gc', ...args], {
    env: { ...process.env, TF_CPP_MIN_LOG_LEVEL: '0' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((done) => child.on('exit', done));
  const row = stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .find((r) => r.bench === 'hf');
  if (code !== 0 || row === undefined) {
    return { bench: 'gpu-rxrl', failed: `bench hf exited with ${code}: ${failureReason(stderr)}` };
  }
  const gpuPackage = existsSync(fileURLToPath(new URL('../../node_modules/@tensorflow/tfjs-node-gpu/package.json', import.meta.url)));
  return { ...row, bench: 'gpu-rxrl', rxrl_device: tensorflowDevice(stderr), tfjs_node_gpu: gpuPackage };
}

export async function main(args: readonly string[]): Promise<void> {
  const options = parse(args);
  const gpu = nvidiaGpu();
  if (gpu === null && !options.allowCpu) {
    console.log(JSON.stringify({ bench: 'gpu', skipped: 'no NVIDIA GPU here (nvidia-smi lists none); --allow-cpu runs the bench anyway' }));
    return;
  }
  console.log(JSON.stringify({ bench: 'gpu', gpu, batch: options.batch, seq: options.seq, lora_rank: options.lora, reps: options.reps }));
  if (options.build) await build();
  const rxrl = await rxrlSide(options);
  console.log(JSON.stringify(rxrl));
  const torchArgs = ['--device', 'cuda', '--reps', String(options.reps), '--batch', String(options.batch), '--seq', String(options.seq)];
  torchArgs.push('--lora', String(options.lora), ...(options.modelDir ? ['--model-dir', options.modelDir] : []));
  const torch: Record<string, unknown> = { ...runTorchHf(torchArgs), bench: 'gpu-torch' };
  console.log(JSON.stringify(torch));
  const vs = (key: string): number | null => ratio(rxrl[key], torch[key]);
  console.log(
    JSON.stringify({
      bench: 'gpu-summary',
      gpu: gpu?.name ?? null,
      rxrl_device: rxrl.rxrl_device ?? null,
      torch_device: torch.device ?? null,
      vs_torch: { forward: vs('forward_tok_s'), grad: vs('grad_tok_s'), train: vs('train_tok_s'), lora_train: vs('lora_train_tok_s') },
    }),
  );
}
