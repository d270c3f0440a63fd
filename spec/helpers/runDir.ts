/** Reading what a run leaves in its run directory, for the specs that check it. */
import { existsSync, readFileSync } from 'node:fs';
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
