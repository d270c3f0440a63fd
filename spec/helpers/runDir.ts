/** Reading what a run leaves in its run directory, for the specs that check it. */
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

/** A line of `<run-dir>/trained.jsonl`. */
export interface TrainedLine {
  step: number;
  version: number;
  groups: string[];
  taskIds: string[];
  trajectoryIds: string[];
  policyVersions: number[];
}

/** The JSON lines of `file` (none when it does not exist). */
export function jsonLines<T>(file: string): T[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as T);
}

/** The lines of `<runDir>/trained.jsonl`. */
export function trainedLines(runDir: string): TrainedLine[] {
  return jsonLines<TrainedLine>(join(runDir, 'trained.jsonl'));
}

/**
 * A fingerprint of what a run has written so far (the run directory's entries and their sizes): a `progress` measure
 * for `waitFor`, which changes whenever the run trains a step, writes a metric or a checkpoint.
 */
export function runDirProgress(runDir: string): string {
  try {
    return readdirSync(runDir)
      .map((name) => `${name}:${statSync(join(runDir, name)).size}`)
      .join(',');
  } catch {
    // Not there yet, or an entry went between the listing and its stat: the next poll sees it.
    return '';
  }
}
