/**
 * The processes an agent command starts, found and ended as one tree, including descendants that left its process
 * group or session (`setsid`, a double fork, `nohup`).
 *
 * An agent is spawned `detached`, so it leads a new session and process group whose id is its pid, and with a
 * random cookie in its environment ({@link SAMPLE_COOKIE_VARIABLE}), which every descendant inherits. On Linux a
 * process belongs to the tree when `/proc/<pid>/stat` puts it in the agent's process group or session, or when
 * `/proc/<pid>/environ` carries the cookie: that finds a descendant that called `setsid` and whose parent exited
 * long ago (no parent link leads to it any more), without polling while the agent runs. It misses only a
 * descendant that both leaves the session and execs with a cleaned environment (`setsid env -i …`) or overwrites
 * its environment block (as `setproctitle` does), or that runs as another user. Elsewhere (no `/proc`) the tree is the process group.
 *
 * Ending a tree ({@link endTree}) sends SIGTERM to every member, waits until they are gone or the grace period
 * passes, then sends SIGKILL in rounds until a scan finds none (a process that forks meanwhile is caught by the
 * next round). Trees still alive when the process exits are killed by an `exit` hook ({@link trackTree}).
 *
 * @packageDocumentation
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';

/** The environment variable holding a sample's cookie; set in every agent's environment. */
export const SAMPLE_COOKIE_VARIABLE = 'RXRL_AGENT_SAMPLE';

/** An agent's processes: its group and session, and the cookie in their environment. */
export interface ProcessTree {
  /** The agent's pid: the id of the process group and session it leads. */
  readonly leader: number;
  /** The value of {@link SAMPLE_COOKIE_VARIABLE} in the agent's environment (unique per sample). */
  readonly cookie: string;
}

/** How often a tree is scanned while its members are given time to exit after SIGTERM. */
const POLL_MS = 25;
/** Most SIGKILL rounds; each catches what the previous round's members forked before they died. */
const KILL_ROUNDS = 100;

const hasProc = existsSync('/proc/self/stat');

/**
 * The live (not zombie) members of `tree`, by pid; the calling process is never one. Without `/proc`: the
 * process group's leader when the group still has a member, else none.
 */
export function treeMembers(tree: ProcessTree): number[] {
  if (!hasProc) return groupAlive(tree.leader) ? [tree.leader] : [];
  const marker = Buffer.from(`${SAMPLE_COOKIE_VARIABLE}=${tree.cookie}\0`);
  const members: number[] = [];
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid) continue;
    const stat = procStat(pid);
    if (stat === undefined || stat.state === 'Z' || stat.state === 'X') continue;
    if (stat.group === tree.leader || stat.session === tree.leader || environHas(pid, marker)) members.push(pid);
  }
  return members;
}

/**
 * Ends every process of `tree`: SIGTERM, up to `graceMs` for them to exit, then SIGKILL until none is left.
 *
 * @param tree - The agent's tree.
 * @param graceMs - How long members may take to exit after SIGTERM.
 * @returns How many members the first scan found.
 */
export async function endTree(tree: ProcessTree, graceMs: number): Promise<number> {
  const members = treeMembers(tree);
  if (members.length === 0) return 0;
  signalTree(tree, members, 'SIGTERM');
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline && treeMembers(tree).length > 0) await new Promise((r) => setTimeout(r, POLL_MS));
  killTree(tree);
  return members.length;
}

/** SIGKILL in rounds until a scan finds no member of `tree` (synchronous: safe in an `exit` hook). */
export function killTree(tree: ProcessTree): void {
  for (let round = 0; round < KILL_ROUNDS; round++) {
    const members = treeMembers(tree);
    if (members.length === 0) return;
    signalTree(tree, members, 'SIGKILL');
  }
}

const tracked = new Set<ProcessTree>();
let exitHook = false;

/**
 * Keeps `tree` on the list that the process's `exit` hook kills, until the returned function is called (when
 * the tree has been ended). A process killed by a signal it does not handle runs no hook: the CLI handles SIGINT
 * and SIGTERM by stopping the run, which ends its samples.
 *
 * @param tree - A running agent's tree.
 * @returns Removes it from the list.
 */
export function trackTree(tree: ProcessTree): () => void {
  if (!exitHook) {
    exitHook = true;
    process.on('exit', () => {
      for (const t of tracked) killTree(t);
    });
  }
  tracked.add(tree);
  return () => tracked.delete(tree);
}

/** Sends `signal` to each member (Linux, members checked by the scan) or to the process group (elsewhere). */
function signalTree(tree: ProcessTree, members: readonly number[], signal: NodeJS.Signals): void {
  const targets = hasProc ? members : [-tree.leader];
  for (const pid of targets) {
    try {
      process.kill(pid, signal);
    } catch {
      // gone meanwhile
    }
  }
}

function groupAlive(leader: number): boolean {
  try {
    process.kill(-leader, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Whether `pid` runs: its `/proc` entry exists and it is no zombie (a dead process nobody reaped yet). Linux only.
 *
 * @param pid - A process id.
 */
export function isRunning(pid: number): boolean {
  const state = procStat(pid)?.state;
  return state !== undefined && state !== 'Z' && state !== 'X';
}

/** State, process group and session of `pid` from `/proc/<pid>/stat` (fields 3, 5 and 6), if it still exists. */
function procStat(pid: number): { state: string; group: number; session: number } | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined;
  }
  // The command name (field 2) is in parentheses and may hold spaces or ')': the fields after it follow the last ')'.
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { state: fields[0], group: Number(fields[2]), session: Number(fields[3]) };
}

/** Whether `/proc/<pid>/environ` (the environment it was started with) holds `marker`; false when unreadable. */
function environHas(pid: number, marker: Buffer): boolean {
  try {
    const environ = readFileSync(`/proc/${pid}/environ`);
    return environ.indexOf(marker) >= 0;
  } catch {
    return false;
  }
}
