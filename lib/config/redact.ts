/**
 * The one rule for what is a secret in a configuration, shared by everything that shows or sends one (`rxrl config`,
 * the params of an MLflow run): a value is redacted when it sits under an `env` map (an agent's environment variables,
 * whatever their names), or when its own key names a secret — one of its words (`apiKey` → api, key; `HF_TOKEN` → hf,
 * token) is {@link SECRET_WORDS} — and a URL's password (`http://user:pass@host`) is masked wherever it appears.
 *
 * @packageDocumentation
 */

/** What a redacted value reads as. */
export const REDACTED = '[redacted]';

/** Words of a key that make its value a secret (whole words: `maxTokens` is not one, `accessToken` is). */
export const SECRET_WORDS: ReadonlySet<string> = new Set([
  'token',
  'key',
  'apikey',
  'password',
  'passwd',
  'pwd',
  'passphrase',
  'secret',
  'auth',
  'authorization',
  'credential',
  'credentials',
  'cookie',
  'bearer',
]);

/** Names of maps whose every value is a secret (environment variables carry tokens under any name). */
const SECRET_MAPS: ReadonlySet<string> = new Set(['env']);

/** The words of one key: split at camelCase humps and at anything not a letter or digit, lower-cased. */
function wordsOf(key: string): string[] {
  return key
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .split(/[^A-Za-z0-9]+/)
    .filter((w) => w.length > 0)
    .map((w) => w.toLowerCase());
}

/**
 * Whether the value at `path` is a secret.
 *
 * @param path - the key's path, as segments (`['rollout', 'agent', 'env', 'HF_TOKEN']`), dotted (`openai.apiKey`) or both.
 * @returns true under an `env` map, or when the last key has a word of {@link SECRET_WORDS}.
 */
export function isSecretKey(path: string | readonly string[]): boolean {
  const segments = (typeof path === 'string' ? [path] : path).flatMap((segment) => segment.split('.'));
  if (segments.slice(0, -1).some((segment) => SECRET_MAPS.has(segment.toLowerCase()))) return true;
  const last = segments.at(-1) ?? '';
  return wordsOf(last).some((word) => SECRET_WORDS.has(word));
}

/** `text` with the password of every URL in it masked (`http://user:[redacted]@host`). */
export function redactUrlPasswords(text: string): string {
  return text.replace(/\b([a-z][a-z0-9+.-]*:\/\/[^/\s:@]*):[^/\s@]*@/gi, `$1:${REDACTED}@`);
}

/**
 * A copy of `value` with every secret replaced by {@link REDACTED} (see the module comment); empty and null secrets
 * are kept as they are (they say "none given").
 *
 * @param value - a configuration, any part of one, or its leaves flattened (`{ 'rollout.agent.env.X': … }`).
 * @param path - where `value` sits (for a part).
 */
export function redactSecrets<T>(value: T, path: readonly string[] = []): T {
  if (path.length > 0 && isSecretKey(path) && value !== null && value !== '' && typeof value !== 'object') return REDACTED as T;
  if (typeof value === 'string') return redactUrlPasswords(value) as T;
  if (Array.isArray(value)) return value.map((item: unknown, i) => redactSecrets(item, [...path, String(i)])) as T;
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[key] = redactSecrets(item, [...path, key]);
    return out as T;
  }
  return value;
}
