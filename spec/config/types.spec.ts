import convict from 'convict';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { SCHEMA, loadConfig, type AgentRoleConfig, type PolicyEntryConfig, type RxrlConfig } from '../../lib/config/schema.js';

// The type assertions below (expectTypeOf, @ts-expect-error) are checked by `npm run typecheck`
// (`tsc -p tsconfig.json --noEmit`, which includes spec/ and runs before `npm test`): RxrlConfig is derived from
// SCHEMA, so changing a leaf's format there (say `model.path` to 'non-empty-string') fails them to compile.

/** Every leaf of SCHEMA with its dotted path (a leaf has a `doc`, as in loadConfig's own walk). */
function leaves(group: object, prefix = ''): [string, convict.SchemaObj][] {
  return Object.entries(group).flatMap(([key, node]: [string, object]) => {
    const path = prefix ? `${prefix}.${key}` : key;
    return 'doc' in node ? [[path, node as convict.SchemaObj] as const] : leaves(node, path);
  });
}

describe('RxrlConfig: typed from SCHEMA', () => {
  it('types each leaf by its format: enum lists as their unions, optional formats with null, maps and entry lists', () => {
    expectTypeOf<RxrlConfig['run']['backend']>().toEqualTypeOf<'auto' | 'wasm' | 'cpu' | 'tensorflow'>();
    expectTypeOf<RxrlConfig['algorithm']['klInReward']['estimator']>().toEqualTypeOf<'k1' | 'abs' | 'mse' | 'k3' | 'low_var_kl'>();
    expectTypeOf<RxrlConfig['model']['path']>().toEqualTypeOf<string | null>();
    expectTypeOf<RxrlConfig['model']['maxModelLen']>().toEqualTypeOf<number | null>();
    expectTypeOf<RxrlConfig['model']['dModel']>().toEqualTypeOf<number>();
    expectTypeOf<RxrlConfig['rollout']['topP']>().toEqualTypeOf<number>();
    expectTypeOf<RxrlConfig['trainer']['clipLow']>().toEqualTypeOf<number>();
    expectTypeOf<RxrlConfig['checkpoint']['onStop']>().toEqualTypeOf<boolean>();
    expectTypeOf<RxrlConfig['rollout']['agent']['env']>().toEqualTypeOf<Record<string, string>>();
    expectTypeOf<RxrlConfig['rollout']['agent']['export']>().toEqualTypeOf<string>();
    expectTypeOf<RxrlConfig['kafka']['brokers']>().toEqualTypeOf<string>();
    expectTypeOf<RxrlConfig['agents']['roles']>().toEqualTypeOf<AgentRoleConfig[]>();
    expectTypeOf<RxrlConfig['policies']>().toEqualTypeOf<PolicyEntryConfig[]>();
    expectTypeOf<keyof RxrlConfig['store']>().toEqualTypeOf<'groupTimeoutMs' | 'onGroupTimeout'>();

    const config = loadConfig({ env: {} });
    expect(config.run.backend).toBe('auto');
    expect(config.model.path).toBeNull();
    expect(config.rollout.agent.env).toEqual({});
    expect(config.policies).toEqual([]);
  });

  it('is writable where callers assign into it, and only with values of the leaf type', () => {
    const config = loadConfig({ env: {} });
    config.run.dir = '/tmp/rxrl-run';
    config.sync.mode = 'fully-async';
    config.rollout.agent.env.KEY = 'value';
    config.policies.push({ name: 'p', specialization: 'full' });
    // @ts-expect-error not one of run.backend's values
    config.run.backend = 'gpu';
    // @ts-expect-error model.path is a string or null
    config.model.path = 3;
    // @ts-expect-error no such key in SCHEMA
    config.run.dirr = '/tmp';
    expect(config.run.dir).toBe('/tmp/rxrl-run');
    expect(config.sync.mode).toBe('fully-async');
    expect(config.rollout.agent.env).toEqual({ KEY: 'value' });
    expect(config.policies).toHaveLength(1);
  });
});

describe('SCHEMA', () => {
  const all = leaves(SCHEMA);

  it('has a doc, a format and a default on every leaf', () => {
    expect(all.length).toBeGreaterThan(100); // the walk finds the whole schema (111 leaves today), not an empty list
    for (const [path, leaf] of all) {
      expect(typeof leaf.doc === 'string' && leaf.doc.length > 0, `${path}.doc`).toBe(true);
      expect('format' in leaf && 'default' in leaf, `${path}: format and default`).toBe(true);
    }
  });

  it("gives every leaf a default that passes the leaf's own format", () => {
    for (const [path, leaf] of all) {
      const one = convict({ [path.replaceAll('.', '_')]: leaf }, { env: {}, args: [] });
      expect(() => one.validate({ allowed: 'strict' }), path).not.toThrow();
    }
  });

  it('checks the leaf check itself: a default outside its format is rejected', () => {
    const bad = convict(
      { seed: { ...SCHEMA.run.seed, default: -1 }, backend: { ...SCHEMA.run.backend, default: 'gpu' } },
      { env: {}, args: [] },
    );
    expect(() => bad.validate({ allowed: 'strict' })).toThrow(/seed: must be an integer >= 0[\s\S]*backend: must be one of/);
  });
});
