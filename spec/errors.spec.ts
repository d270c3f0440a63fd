import { describe, expect, it } from 'vitest';
import { AbortError, ConfigError, EngineError, isAbortError, isRetriable, throwIfAborted } from '../lib/core/errors.js';

describe('errors', () => {
  it('carries name, retriable flag, cause and context', () => {
    const cause = new Error('socket hang up');
    const error = new EngineError('generate failed', { cause, retriable: true, context: { requests: 3 } });
    expect(error.name).toBe('EngineError');
    expect(error.retriable).toBe(true);
    expect(error.cause).toBe(cause);
    expect(error.context).toEqual({ requests: 3 });
    expect(isRetriable(error)).toBe(true);
    expect(isRetriable(new ConfigError('bad key'))).toBe(false);
    expect(isRetriable(new Error('plain'))).toBe(false);
  });

  it('recognises aborts from signals and from rxrl', () => {
    const controller = new AbortController();
    expect(() => throwIfAborted(controller.signal)).not.toThrow();
    controller.abort();
    expect(() => throwIfAborted(controller.signal)).toThrow(AbortError);
    expect(isAbortError(new DOMException('x', 'AbortError'))).toBe(true);
    expect(isAbortError(new Error('x'))).toBe(false);
  });
});
