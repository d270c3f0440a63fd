/**
 * The configuration reference: `docs/configuration-reference.md`, rendered from {@link SCHEMA} (every key with its
 * format, default, environment variable and doc text) and checked against the committed file.
 *
 * @packageDocumentation
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { SCHEMA, schemaLeaves } from './schema.js';

/** Where the reference is written, relative to the repository root. */
export const CONFIG_REFERENCE_FILE = 'docs/configuration-reference.md';

/** The command that writes the reference (named in its header). */
export const CONFIG_REFERENCE_COMMAND = 'npm run docs:config';

/** What each registered format accepts, as the reference says it. */
const FORMAT_TEXT: Readonly<Record<string, string>> = {
  'positive-int': 'integer ≥ 1',
  'non-negative-int': 'integer ≥ 0',
  'positive-number': 'number > 0',
  'non-negative-number': 'number ≥ 0',
  'finite-number': 'number',
  'unit-interval': 'number in (0, 1]',
  'clip-range': 'number in [0, 1)',
  'optional-positive-number': 'null or number > 0',
  'optional-positive-int': 'null or integer ≥ 1',
  'optional-non-negative-int': 'null or integer ≥ 0',
  'optional-string': 'null or non-empty string',
  flag: 'true or false',
  'string-map': 'object of strings',
  'non-empty-string': 'non-empty string',
  'shard-size': 'size (`"50GB"`, `"500MB"`, `"2GiB"`) or number of bytes',
  'agent-roles': 'list of `{name, policy, prompt?}`',
  'policy-entries': 'list of `{name, specialization, lora?, adapterPath?}`',
};

/** One key of the schema, as the reference lists it. */
export interface ConfigKey {
  /** Dotted path, e.g. `trainer.learningRate`. */
  readonly key: string;
  /** What values it takes, in words. */
  readonly format: string;
  /** The default, as JSON. */
  readonly default: string;
  /** The environment variable that sets it, if any. */
  readonly env: string | undefined;
  /** Whether the value is a secret (masked wherever the configuration is printed or logged). */
  readonly sensitive: boolean;
  /** The schema's doc text. */
  readonly doc: string;
}

/** A leaf of the schema as it is read here: convict's own fields. */
/** The words for a leaf's format: a registered format's text, a list of allowed values, or any string. */
function formatText(key: string, format: unknown): string {
  if (format === String) return 'string';
  if (Array.isArray(format)) return `one of ${format.map((v) => `\`${String(v)}\``).join(', ')}`;
  const text = typeof format === 'string' ? FORMAT_TEXT[format] : undefined;
  if (text === undefined) {
    throw new Error(`${key}: format ${String(format)} has no text in lib/config/reference.ts (add it to FORMAT_TEXT)`);
  }
  return text;
}

/**
 * Every key of a schema, in the schema's order.
 *
 * @param schema - a convict schema of nested groups and leaves (default rxrl's {@link SCHEMA}).
 * @returns one entry per leaf, keyed by its dotted path.
 * @throws Error naming the key for a leaf without doc text or with a format the reference has no words for.
 */
export function configKeys(schema: object = SCHEMA): ConfigKey[] {
  return schemaLeaves(schema).map(({ key, leaf }) => {
    if (typeof leaf.doc !== 'string' || leaf.doc.trim() === '') {
      throw new Error(`${key}: the schema gives no doc text (add one in lib/config/schema.ts)`);
    }
    return {
      key,
      format: formatText(key, leaf.format),
      default: JSON.stringify(leaf.default),
      env: leaf.env,
      sensitive: leaf.sensitive === true,
      doc: leaf.doc.trim(),
    };
  });
}

/** Text made safe for a Markdown table cell. */
function cell(text: string): string {
  return text.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');
}

/** Plain text made safe for Markdown: `<run-dir>` and `'*'` stay as written, not a tag or emphasis. */
function plain(text: string): string {
  return text.replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/\*/g, '\\*');
}

function row(k: ConfigKey): string {
  const env = k.env === undefined ? '' : `\`${k.env}\``;
  const doc = k.sensitive ? `${k.doc} Secret: masked wherever the configuration is printed or logged.` : k.doc;
  return `| \`${k.key}\` | ${cell(k.format)} | \`${cell(k.default)}\` | ${env} | ${cell(plain(doc))} |`;
}

/**
 * The reference as Markdown: a header saying how it is made, then one table per top-level section.
 *
 * @param schema - the schema to document (default rxrl's {@link SCHEMA}).
 * @returns the file's text, ending in a newline.
 */
export function renderConfigReference(schema: object = SCHEMA): string {
  const sections = new Map<string, ConfigKey[]>();
  for (const k of configKeys(schema)) {
    const section = k.key.split('.')[0] ?? k.key;
    sections.set(section, [...(sections.get(section) ?? []), k]);
  }
  const lines = [
    '# Configuration reference',
    '',
    `Generated from the configuration schema (\`lib/config/schema.ts\`) by \`${CONFIG_REFERENCE_COMMAND}\`; do not edit it by hand.`,
    'Every key can be set in a recipe (YAML or JSON, nested by section) or on the command line with',
    '`--set key=value`; a key with an environment variable can be set by it too. A value is taken from, last one',
    'winning: the default, the environment variable, the recipe, `--set`; for `run.steps` and `run.seed`, the',
    '`--steps` and `--seed` flags (or `RXRL_STEPS` and `RXRL_SEED`) win over all of them. A path given with `--set` is',
    "relative to the working directory; a path in a recipe, to the recipe's directory.",
    '',
    `Sections: ${[...sections.keys()].map((s) => `[\`${s}\`](#${s.toLowerCase()})`).join(', ')}.`,
  ];
  for (const [section, keys] of sections) {
    lines.push('', `## ${section}`, '', '| Key | Format | Default | Environment | Description |', '| --- | --- | --- | --- | --- |');
    lines.push(...keys.map(row));
  }
  return `${lines.join('\n')}\n`;
}

/**
 * The first difference between the reference as it should be and as it is, in words; undefined when they match.
 *
 * @param expected - the rendered reference.
 * @param actual - the file's text.
 * @returns `line N: expected '…', found '…'`, or undefined.
 */
export function referenceDifference(expected: string, actual: string): string | undefined {
  if (expected === actual) return undefined;
  const want = expected.split('\n');
  const have = actual.split('\n');
  for (let i = 0; i < Math.max(want.length, have.length); i++) {
    if (want[i] !== have[i]) {
      const show = (line: string | undefined): string => (line === undefined ? '(end of file)' : `'${line}'`);
      return `line ${i + 1}: expected ${show(want[i])}, found ${show(have[i])}`;
    }
  }
  return 'the files differ';
}

/** What {@link writeConfigReference} did: an exit code and a one-line message. */
export interface ConfigReferenceOutcome {
  /** 0 when written or up to date, 1 when `--check` found the file stale or missing. */
  readonly code: 0 | 1;
  /** One line for the user. */
  readonly message: string;
}

/**
 * `npm run docs:config`: writes the reference, or with `check` compares the committed file with it.
 *
 * @param options.root - the repository root the file's path is taken from.
 * @param options.check - compare instead of writing.
 * @param options.file - the file, relative to `root` (default {@link CONFIG_REFERENCE_FILE}).
 * @returns what was done.
 */
export function writeConfigReference(options: { root: string; check?: boolean; file?: string }): ConfigReferenceOutcome {
  const file = options.file ?? CONFIG_REFERENCE_FILE;
  const path = resolve(options.root, file);
  const expected = renderConfigReference();
  if (options.check !== true) {
    writeFileSync(path, expected);
    return { code: 0, message: `wrote ${file} (${configKeys().length} keys)` };
  }
  let actual: string;
  try {
    actual = readFileSync(path, 'utf8');
  } catch {
    return { code: 1, message: `${file} is missing; run \`${CONFIG_REFERENCE_COMMAND}\` to write it` };
  }
  const difference = referenceDifference(expected, actual);
  if (difference === undefined) return { code: 0, message: `${file} is up to date` };
  return { code: 1, message: `${file} is stale (${difference}); run \`${CONFIG_REFERENCE_COMMAND}\` to rewrite it` };
}
