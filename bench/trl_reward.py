#!/usr/bin/env python3
"""The arithmetic task's reward in Python, for TRL's side of ``npm run bench -- trl``.

A port of ``equationEvaluator`` (``recipes/arithmetic.ts``): 1 when the response states the question's equation
with the right result (``7 * 8 = 56``, surrounding words allowed), ``FORMAT_CREDIT`` when it states the equation
with a wrong result, 0 otherwise, and 0 for a response the token budget cut off. The pattern's character classes
are spelled out so that they match exactly what JavaScript's ``\\d`` and ``\\s`` match (Python's would also take
other scripts' digits and a slightly different set of spaces).

``python3 bench/trl_reward.py --check`` reads a JSON list of ``{"response", "answer", "truncated"}`` on stdin and
prints the list of ``{"reward", "format", "correct"}``: ``spec/bench/trlReward.spec.ts`` compares it with the
TypeScript evaluator. Standard library only.
"""
from __future__ import annotations

import json
import re
import sys

FORMAT_CREDIT = 0.2

# JavaScript's \s: ECMAScript white space and line terminators.
_SPACE = "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_NUMBER = "(-?[0-9]+)"
EQUATION = re.compile(f"{_NUMBER}{_SPACE}*([+*-]){_SPACE}*{_NUMBER}{_SPACE}*={_SPACE}*{_NUMBER}")


def score(response: str, answer: str, truncated: bool) -> dict:
    """Reward and metrics of one response to the question whose answer is ``answer`` (``"7 * 8 = 56"``)."""
    question = answer.split(" = ")[0]
    match = None if truncated else EQUATION.search(response)
    form = match is not None and f"{match[1]} {match[2]} {match[3]}" == question
    correct = form and f"{question} = {match[4]}" == answer
    return {"reward": 1.0 if correct else FORMAT_CREDIT if form else 0.0, "format": int(form), "correct": int(correct)}


def equation_reward(completions, answer, completion_ids, eos_ids, **_unused) -> list[float]:
    """A TRL reward function: ``completions`` decoded, ``completion_ids`` (for the cut-off test), ``answer`` per row.

    A completion is cut off when its last token is not a stop token (TRL's own truncation test).
    """
    return [score(text, a, len(ids) == 0 or ids[-1] not in eos_ids)["reward"] for text, a, ids in zip(completions, answer, completion_ids, strict=True)]


def main() -> None:
    if sys.argv[1:] != ["--check"]:
        sys.exit("usage: python3 bench/trl_reward.py --check < cases.json")
    cases = json.load(sys.stdin)
    json.dump([score(c["response"], c["answer"], bool(c["truncated"])) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
