import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

import { arithmeticTask, equationEvaluator } from '../../recipes/arithmetic.js';

const root = resolve(import.meta.dirname, '..', '..');

interface Case {
  readonly response: string;
  readonly answer: string;
  readonly truncated: boolean;
}

/** Responses to each question: right, wrong result, another question's equation, words around, odd spacing, none. */
function cases(): Case[] {
  const { train } = arithmeticTask({ operators: '+-*', maxOperand: 12, validationSize: 8, seed: 3 });
  const out: Case[] = [];
  for (const task of train.slice(0, 40)) {
    const answer = task.answer!;
    const [question, result] = answer.split(' = ');
    const [a, op, b] = question.split(' ');
    out.push(
      { response: answer, answer, truncated: false },
      { response: answer, answer, truncated: true },
      { response: `${question} = ${Number(result) + 1}`, answer, truncated: false },
      { response: `${b} ${op} ${a} = ${result}`, answer, truncated: false },
      { response: `Sure! ${a}${op}${b}=${result}. Done`, answer, truncated: false },
      { response: `${a}\u00a0${op}\u2003${b} =\n${result}`, answer, truncated: false },
      { response: `${a} ${op} ${b} = \u0661\u0662`, answer, truncated: false },
      { response: `${a}\u001c${op} ${b} = ${result}`, answer, truncated: false },
      { response: `The answer is ${result}.`, answer, truncated: false },
      { response: `${a} ${op} ${b} = -${result}`, answer, truncated: false },
      { response: '', answer, truncated: false },
    );
  }
  return out;
}

describe('bench/trl_reward.py', () => {
  it('scores every response as equationEvaluator does', () => {
    const all = cases();
    const run = spawnSync('python3', [join(root, 'bench', 'trl_reward.py'), '--check'], { input: JSON.stringify(all), encoding: 'utf8' });
    expect(run.status, run.stderr).toBe(0);
    const python = JSON.parse(run.stdout) as { reward: number; format: number; correct: number }[];
    const ours = all.map((c) => {
      const result = equationEvaluator.evaluate({ id: 'q', prompt: '', answer: c.answer }, c.response, undefined, {
        finishReason: c.truncated ? 'length' : 'stop',
        tokens: [1],
      }) as { reward: number; metrics?: Record<string, number> };
      return { reward: result.reward, format: result.metrics?.format, correct: result.metrics?.correct };
    });
    expect(python).toEqual(ours);
    // The cases cover every outcome.
    expect(new Set(ours.map((o) => o.reward))).toEqual(new Set([0, 0.2, 1]));
  });
});
