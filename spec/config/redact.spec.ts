/** The one redaction rule (`rxrl config`'s printing and MLflow's params): env maps and keys that name a secret. */
import { describe, expect, it } from 'vitest';

import { REDACTED, isSecretKey, redactSecrets, redactUrlPasswords } from '../../lib/config/redact.js';
import { SCHEMA, describeConfig, loadConfig } from '../../lib/config/schema.js';

/** Every leaf of the schema with its path and whether it is marked `sensitive`. */
function leaves(group: object, path: string[] = []): { path: string[]; sensitive: boolean }[] {
  return Object.entries(group).flatMap(([key, value]: [string, Record<string, unknown>]) =>
    'doc' in value ? [{ path: [...path, key], sensitive: value.sensitive === true }] : leaves(value, [...path, key]),
  );
}

describe('isSecretKey', () => {
  it('names secrets by whole words of the key, and everything under an env map', () => {
    for (const key of [
      'openai.apiKey',
      'distill.teacher.apiKey',
      'HF_TOKEN',
      'accessToken',
      'db_password',
      'clientSecret',
      'x.auth',
      'awsCredentials',
    ])
      expect(isSecretKey(key), key).toBe(true);
    expect(isSecretKey(['rollout', 'agent', 'env', 'PLAIN'])).toBe(true);
    expect(isSecretKey('rollout.agent.env.PLAIN')).toBe(true);
    for (const key of [
      'rollout.maxTokens',
      'model.tokenizer',
      'checkpoint.keepLast',
      'agents.environment',
      'rollout.agent.inheritEnv',
      'data.trainFile',
    ])
      expect(isSecretKey(key), key).toBe(false);
  });

  it('covers every schema key marked sensitive', () => {
    const sensitive = leaves(SCHEMA).filter((leaf) => leaf.sensitive);
    expect(sensitive.length).toBeGreaterThan(0);
    for (const leaf of sensitive) expect(isSecretKey(leaf.path), leaf.path.join('.')).toBe(true);
  });
});

describe('redactSecrets', () => {
  it('masks secrets and URL passwords, keeps empty and null secrets, copies the rest', () => {
    const value = {
      a: { apiKey: 'sk-1', token: '', secret: null },
      env: { ANY: 'v' },
      url: 'http://u:pw@h:1/x',
      n: 3,
      list: [{ password: 'p' }],
    };
    expect(redactSecrets(value)).toEqual({
      a: { apiKey: REDACTED, token: '', secret: null },
      env: { ANY: REDACTED },
      url: `http://u:${REDACTED}@h:1/x`,
      n: 3,
      list: [{ password: REDACTED }],
    });
    expect(value.a.apiKey).toBe('sk-1');
    expect(redactUrlPasswords('see https://user@h and ftp://a:b@c')).toBe(`see https://user@h and ftp://a:${REDACTED}@c`);
  });

  it("rxrl config's printing shows no secret: the teacher's key, the agent's env, API keys", () => {
    const printed = describeConfig(
      loadConfig({
        env: { OPENAI_API_KEY: 'sk-SECRET1', TINKER_API_KEY: 'tk-SECRET2' },
        values: {
          distill: { teacher: { apiKey: 'sk-SECRET3' } },
          rollout: { agent: { env: { HF_TOKEN: 'hf_SECRET4', OTHER: 'SECRET5' } } },
        },
      }),
    );
    for (let i = 1; i <= 5; i++) expect(printed).not.toContain(`SECRET${i}`);
    const parsed = JSON.parse(printed) as { distill: { teacher: { apiKey: string } }; rollout: { agent: { env: Record<string, string> } } };
    expect(parsed.distill.teacher.apiKey).toBe(REDACTED);
    expect(parsed.rollout.agent.env).toEqual({ HF_TOKEN: REDACTED, OTHER: REDACTED });
  });
});
