"""A calculator agent on PyPI's `openai` client: nothing in it knows about rxrl.

It reads its task from RXRL_TASK (JSON with a "prompt"), asks the model with a `calc` tool on offer, runs the tool
calls it gets back, and sends the results until the model answers without a call (at most MAX_TURNS turns). The
client reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment, as it always does; under `rxrl run` they
point at a session of rxrl's gateway, which records the exact tokens of every call. The agent prints its answer;
the recipe's evaluator scores it (an agent may instead print {"reward": r} as its last line).
"""

import ast
import json
import operator
import os

from openai import OpenAI

MAX_TURNS = 3
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluates an integer arithmetic expression with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> str:
    """The value of an integer expression with + - * and parentheses, or '?' for anything else."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("not an integer expression")

    try:
        if len(expression) > 64:
            raise ValueError("too long")
        return str(value(ast.parse(expression, mode="eval").body))
    except (ValueError, SyntaxError, RecursionError):
        return "?"


def main() -> None:
    task = json.loads(os.environ["RXRL_TASK"])
    client = OpenAI(max_retries=0)
    model = os.environ.get("OPENAI_MODEL", "policy")
    messages = [{"role": "user", "content": task["prompt"]}]
    answer = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[CALC]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        answer = reply.content or ""
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": evaluate(str(expression))})
    print(answer)


if __name__ == "__main__":
    main()
