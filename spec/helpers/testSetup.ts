/**
 * What `npm test`'s setup (scripts/test-setup.sh) could not install on this machine (no root for apt), as it wrote
 * to `.cache/test-setup.json`. Only those specs skip, and the setup printed one line naming the command that would
 * install what they need; anything the setup did install, or that it was never asked about, is expected to work.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** What the setup may be unable to bring without root. */
export type Provision = 'python' | 'chromium' | 'skyrl' | 'registry';

const statusFile = fileURLToPath(new URL('../../.cache/test-setup.json', import.meta.url));

/** Whether the setup could not bring `what` here: the specs that need it skip (`describe.skipIf(lacks('python'))`). */
export function lacks(what: Provision): boolean {
  return unavailable(what) !== undefined;
}

/**
 * @param what - A provision of the setup.
 * @returns The line the setup printed when it could not install `what` here, else `undefined`.
 */
export function unavailable(what: Provision): string | undefined {
  let status: { unavailable?: Partial<Record<Provision, string>> };
  try {
    status = JSON.parse(readFileSync(statusFile, 'utf8')) as typeof status;
  } catch {
    return undefined;
  }
  return status.unavailable?.[what];
}
