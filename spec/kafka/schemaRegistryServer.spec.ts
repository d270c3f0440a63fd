/**
 * rxrl's record schema (proto/rxrl/v1/records.proto) in a real Confluent-compatible schema registry (Apicurio
 * Registry, started by spec/helpers/schemaRegistry.ts), through the npm Confluent client: the registry itself
 * refuses a version that breaks the subject's compatibility level, and takes a compatible one.
 */
import { readFileSync } from 'node:fs';

import { COMPATIBILITY, SchemaRegistry, SchemaType } from '@kafkajs/confluent-schema-registry';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { startSchemaRegistry, type SchemaRegistryServer } from '../helpers/schemaRegistry.js';
import { lacks, unavailable } from '../helpers/testSetup.js';
import { uniqueName } from './helpers.js';

const RECORDS = readFileSync(new URL('../../proto/rxrl/v1/records.proto', import.meta.url), 'utf8');

/** `RECORDS` with `from` replaced by `to` (once; the spec fails if `from` is not there). */
function edited(from: string, to: string): string {
  expect(RECORDS).toContain(from);
  return RECORDS.replace(from, to);
}

/** `RECORDS` with a field appended to message Trajectory: a compatible change. */
function withNewTrajectoryField(): string {
  const start = RECORDS.indexOf('message Trajectory {');
  const end = RECORDS.indexOf('\n}', start);
  expect(start).toBeGreaterThanOrEqual(0);
  return `${RECORDS.slice(0, end)}\n  optional string registry_probe = 99;${RECORDS.slice(end)}`;
}

describe.skipIf(lacks('registry'))(
  `Protocol Buffers schemas in a real schema registry${lacks('registry') ? ` (${unavailable('registry')})` : ''}`,
  () => {
    let server: SchemaRegistryServer;
    let registry: SchemaRegistry;

    beforeAll(async () => {
      server = await startSchemaRegistry();
      registry = new SchemaRegistry({ host: server.url, clientId: 'rxrl-spec', retry: { retries: 0 } });
    });
    afterAll(async () => {
      await server?.stop();
    });

    /** Sets the subject's compatibility level with the Confluent API, `PUT /config/{subject}`. */
    async function setCompatibility(subject: string, compatibility: COMPATIBILITY): Promise<void> {
      const answer = await fetch(`${server.url}/config/${encodeURIComponent(subject)}`, {
        method: 'PUT',
        headers: { 'Content-Type': 'application/vnd.schemaregistry.v1+json' },
        body: JSON.stringify({ compatibility }),
        signal: AbortSignal.timeout(10_000),
      });
      expect(answer.status).toBe(200);
      expect(await answer.json()).toMatchObject({ compatibility });
    }

    /** Registers `schema` (Protocol Buffers text) under `subject`, whose level the client expects to be `level`. */
    function register(subject: string, schema: string, level: COMPATIBILITY) {
      return registry.register({ type: SchemaType.PROTOBUF, schema }, { subject, compatibility: level, updateConfig: false });
    }

    it('takes records.proto, and under BACKWARD refuses a retyped or renumbered field but takes an appended one', async () => {
      const subject = `${uniqueName('rxrl-trajectories')}-value`;
      const { id } = await register(subject, RECORDS, COMPATIBILITY.BACKWARD);
      expect(await registry.getLatestSchemaId(subject)).toBe(id);

      await setCompatibility(subject, COMPATIBILITY.BACKWARD);
      const config = await fetch(`${server.url}/config/${encodeURIComponent(subject)}`, { signal: AbortSignal.timeout(10_000) });
      expect(await config.json()).toMatchObject({ compatibilityLevel: 'BACKWARD' });

      // The registry answers 409 (its compatibility rule, with its diff), and the client throws with that status.
      const refused = { status: 409, message: expect.stringContaining('Incompatible artifact') as unknown };
      const retyped = edited('double reward = 11;', 'string reward = 11;');
      await expect(register(subject, retyped, COMPATIBILITY.BACKWARD)).rejects.toMatchObject(refused);
      const renumbered = edited('double reward = 11;', 'double reward = 31;');
      await expect(register(subject, renumbered, COMPATIBILITY.BACKWARD)).rejects.toMatchObject(refused);
      expect(await registry.getLatestSchemaId(subject)).toBe(id);

      const next = await register(subject, withNewTrajectoryField(), COMPATIBILITY.BACKWARD);
      expect(next.id).not.toBe(id);
      expect(await registry.getLatestSchemaId(subject)).toBe(next.id);
    });

    it('takes the same retyped field under NONE: the refusal above is the compatibility level, checked by the registry', async () => {
      const subject = `${uniqueName('rxrl-trajectories')}-value`;
      const { id } = await register(subject, RECORDS, COMPATIBILITY.BACKWARD);
      await setCompatibility(subject, COMPATIBILITY.NONE);
      const retyped = await register(subject, edited('double reward = 11;', 'string reward = 11;'), COMPATIBILITY.NONE);
      expect(retyped.id).not.toBe(id);
      expect(await registry.getLatestSchemaId(subject)).toBe(retyped.id);
    });
  },
);
