import { describe, expect, it } from 'vitest';
import { applyTransform, partialCredit, partialCreditEvaluator, stringTransformTask } from '../../recipes/stringTransform.js';
import { ConfigError } from '../../lib/core/errors.js';

describe('string transformation recipe', () => {
  it('scores with partial credit per position', () => {
    expect(partialCredit('dcba', 'dcba')).toBe(1);
    expect(partialCredit('dcba', 'dcxa')).toBe(0.75);
    expect(partialCredit('dcba', 'dcbaa')).toBe(0.8);
    expect(partialCredit('dcba', '')).toBe(0);
    expect(partialCredit('dcba', 'abcd')).toBe(0);
    expect(partialCreditEvaluator.evaluate({ id: 'x', prompt: 'abcd=', answer: 'dcba' }, 'dcba')).toMatchObject({
      reward: 1,
      metrics: { accuracy: 1, length_match: 1 },
    });
  });

  it('scores a response the token budget cut off 0, whatever its letters; a stopped one by partial credit', () => {
    const task = { id: 'x', prompt: 'abcd=', answer: 'dcba' };
    const stopped = { finishReason: 'stop' as const, tokens: [6, 5, 4, 3, 2] };
    const cut = { finishReason: 'length' as const, tokens: [6, 5, 4, 3, 3] };
    expect(partialCreditEvaluator.evaluate(task, 'dcba', undefined, stopped)).toMatchObject({ reward: 1, metrics: { accuracy: 1 } });
    expect(partialCreditEvaluator.evaluate(task, 'dcxa', undefined, stopped)).toMatchObject({ reward: 0.75, metrics: { accuracy: 0 } });
    expect(partialCreditEvaluator.evaluate(task, 'dcbaa', undefined, cut)).toMatchObject({
      reward: 0,
      metrics: { accuracy: 0, length_match: 0 },
    });
    // A pad token skipped by the decoder leaves the right text, but the response still never stopped.
    expect(partialCreditEvaluator.evaluate(task, 'dcba', undefined, cut)).toMatchObject({ reward: 0, metrics: { accuracy: 0 } });
  });

  it('applies each transform', () => {
    expect(applyTransform('copy', 'abc', 'abcde')).toBe('abc');
    expect(applyTransform('reverse', 'abc', 'abcde')).toBe('cba');
    expect(applyTransform('shift', 'ade', 'abcde')).toBe('bea');
  });

  it('generates disjoint, reproducible splits covering every string', () => {
    const a = stringTransformTask({ alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 5, seed: 1 });
    const b = stringTransformTask({ alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 5, seed: 1 });
    expect(a.train.length + a.validation.length).toBe(9 + 27);
    expect(a.validation.map((t) => t.id)).toEqual(b.validation.map((t) => t.id));
    const trainPrompts = new Set(a.train.map((t) => t.prompt));
    expect(a.validation.some((t) => trainPrompts.has(t.prompt))).toBe(false);
    expect(a.train[0].prompt.endsWith('=')).toBe(true);
    expect(a.train[0].answer).toBe([...a.train[0].prompt.slice(0, -1)].reverse().join(''));
    expect(a.randomPolicyReward).toBeGreaterThan(0);
    expect(a.randomPolicyReward).toBeLessThan(0.3);
  });

  it('rejects bad options with typed errors', () => {
    expect(() => stringTransformTask({ alphabet: 'aa' })).toThrow(ConfigError);
    expect(() => stringTransformTask({ minLength: 3, maxLength: 2 })).toThrow(ConfigError);
    expect(() => stringTransformTask({ transform: 'sort' as never })).toThrow(/copy, reverse, shift/);
    expect(() => stringTransformTask({ alphabet: 'ab', minLength: 1, maxLength: 1, validationSize: 2 })).toThrow(ConfigError);
    // 5^30 strings would be enumerated (and run out of memory): refused at once, naming the key.
    expect(() => stringTransformTask({ minLength: 30, maxLength: 30 })).toThrow(
      /data\.task: 5 letters of lengths 30\.\.30 make more than 1000000 strings/,
    );
    expect(stringTransformTask({ alphabet: 'ab', minLength: 19, maxLength: 19 }).train.length).toBe(2 ** 19 - 100);
  });
});
