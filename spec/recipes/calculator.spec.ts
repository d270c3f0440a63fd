import { describe, expect, it } from 'vitest';

import { ConfigError, DecodeError } from '../../lib/core/errors.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { calculatorEnvironment, calculatorEvaluator, calculatorTask, evaluateArithmetic } from '../../recipes/calculator.js';

const signal = new AbortController().signal;

describe('calculator recipe', () => {
  it('evaluates integer arithmetic without eval', () => {
    expect(evaluateArithmetic('2+3*4')).toBe(14);
    expect(evaluateArithmetic('(2+3)*4')).toBe(20);
    expect(evaluateArithmetic('-3--4')).toBe(1);
    expect(evaluateArithmetic('0*-5')).toBe(0);
    expect(Object.is(evaluateArithmetic('0*-5'), -0)).toBe(false);
    for (const bad of ['', '2+', '(1', '1)', '2/3', 'process.exit()', '1'.repeat(65), '99999999*99999999*99999999']) {
      expect(() => evaluateArithmetic(bad)).toThrow(DecodeError);
    }
  });

  it('generates disjoint, seeded splits whose text the tokenizer can encode', () => {
    const a = calculatorTask({ maxOperand: 5, validationSize: 10, seed: 1 });
    const b = calculatorTask({ maxOperand: 5, validationSize: 10, seed: 1 });
    expect(a.train.map((t) => t.id)).toEqual(b.train.map((t) => t.id));
    expect(a.train.length + a.validation.length).toBe(2 * 36);
    const ids = new Set(a.validation.map((t) => t.id));
    expect(a.train.some((t) => ids.has(t.id))).toBe(false);
    const tok = new CharTokenizer(a.characters);
    for (const t of [...a.train, ...a.validation]) {
      expect(tok.decode(tok.encode(t.prompt))).toBe(t.prompt);
      expect(String(evaluateArithmetic(t.prompt))).toBe(t.answer);
    }
    expect(tok.encode('calc(1+2)?')).toHaveLength(10);
    expect(a.maxAnswerLength).toBe(2);
    expect(() => calculatorTask({ operators: [] })).toThrow(ConfigError);
    expect(() => calculatorTask({ maxOperand: 0 })).toThrow(ConfigError);
    expect(() => calculatorTask({ maxOperand: 1, validationSize: 8 })).toThrow(ConfigError);
  });

  it('answers calc calls, reports errors with ?, and scores exact answers 1', async () => {
    expect(
      await calculatorEnvironment.call({ id: 'c', name: 'calc', arguments: '{"expression":"6*7"}' }, { id: 't', prompt: '6*7' }, signal),
    ).toBe('42');
    expect(() =>
      calculatorEnvironment.call({ id: 'c', name: 'calc', arguments: '{"expression":"6/7"}' }, { id: 't', prompt: '' }, signal),
    ).toThrow(DecodeError);
    expect(() => calculatorEnvironment.call({ id: 'c', name: 'other', arguments: '{}' }, { id: 't', prompt: '' }, signal)).toThrow(
      DecodeError,
    );
    expect(calculatorEnvironment.errorText?.({ id: 'c', name: 'calc', arguments: '' }, new Error())).toBe('?');
    const task = { id: 't', prompt: '6*7', answer: '42' };
    expect(await calculatorEvaluator.evaluate(task, '42')).toMatchObject({ reward: 1, metrics: { accuracy: 1 } });
    expect(await calculatorEvaluator.evaluate(task, '43')).toMatchObject({ reward: 0.25, metrics: { accuracy: 0 } });
  });
});
