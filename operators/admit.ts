import { Observable } from 'rxjs';
import { isAbortError } from '../lib/core/errors.js';
import type { AdmissionGate } from '../lib/sync/gate.js';
import type { Task } from '../lib/core/types.js';

/** Options of {@link admit}. */
export interface AdmitOptions {
  /** Called with each admitted task and its 0-based admission index (batch = `⌊index / tasksPerBatch⌋`). */
  readonly onAdmit?: (task: Task, index: number) => void;
}

/**
 * Pulls tasks from a pull-based loader only when the admission gate allows them to start, and emits them.
 * Nothing is read ahead of credit; unsubscribing ends the loader (its `finally` blocks run).
 *
 * ```
 * loader (pull):  a b c d …            gate: 2 tasks per batch, sync
 * version:        0---------1------
 * admit(loader, gate)
 * output:         (ab)------(cd)---    batch 1 waits for version 1
 * ```
 *
 * @example
 * ```ts
 * import { AdmissionGate, loadTasks } from 'rxrl';
 * import { admit, rollout } from 'rxrl/operators';
 * const gate = new AdmissionGate({ mode: 'sync', tasksPerBatch: 16 });
 * admit(loadTasks(tasks), gate).pipe(rollout(engine, options));
 * ```
 * @param loader - an `AsyncIterable<Task>` (for example a {@link rxrl!TaskLoader}).
 * @param gate - decides when each task may start (an {@link AdmissionGate}, or several behind one `waitToAdmit`).
 * @param options - `onAdmit(task, index)` sees each task with its 0-based admission index before it is emitted.
 * @returns a cold Observable of admitted tasks; each subscription pulls its own iterator.
 */
export function admit(loader: AsyncIterable<Task>, gate: Pick<AdmissionGate, 'waitToAdmit'>, options: AdmitOptions = {}): Observable<Task> {
  return new Observable<Task>((subscriber) => {
    const controller = new AbortController();
    const iterator = loader[Symbol.asyncIterator]();
    const pump = async (): Promise<void> => {
      for (let index = 0; ; index++) {
        await gate.waitToAdmit(index, controller.signal);
        const next = await iterator.next();
        if (subscriber.closed) return;
        if (next.done) {
          subscriber.complete();
          return;
        }
        options.onAdmit?.(next.value, index);
        subscriber.next(next.value);
      }
    };
    pump().catch((error: unknown) => {
      if (!(controller.signal.aborted && isAbortError(error))) subscriber.error(error);
    });
    return () => {
      controller.abort();
      void iterator.return?.();
    };
  });
}
