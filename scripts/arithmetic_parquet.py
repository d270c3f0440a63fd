"""Writes the arithmetic questions as Parquet datasets in the two layouts rxrl reads, with PyPI `datasets`.

verl/{train,test}.parquet -- verl's layout (its data_preprocess scripts): `prompt` as a list of chat messages,
    `reward_model.ground_truth`, `data_source`, `ability`, `extra_info`.
trl/train/train-0000K-of-0000N.parquet, trl/test.parquet -- TRL's conversational layout as the Hub shards it:
    `prompt` as a list of chat messages, and the column the reward function reads (`ground_truth`).

Usage: python3 scripts/arithmetic_parquet.py --out data/arithmetic [--operators '+*'] [--max-operand 12]
       [--validation-size 64] [--seed 0] [--shards 2]
"""

import argparse
import os
import random

from datasets import Dataset


def questions(operators: str, max_operand: int) -> list[tuple[int, str, int, int]]:
    results = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return [(a, op, b, results[op](a, b)) for op in operators for a in range(1, max_operand + 1) for b in range(1, max_operand + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--operators", default="+*")
    parser.add_argument("--max-operand", type=int, default=12)
    parser.add_argument("--validation-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args()
    rows = questions(args.operators, args.max_operand)
    random.Random(args.seed).shuffle(rows)
    spoken = {"+": "plus", "-": "minus", "*": "times"}
    splits = {"test": rows[: args.validation_size], "train": rows[args.validation_size :]}
    for split, items in splits.items():
        verl, trl = [], []
        for index, (a, op, b, result) in enumerate(items):
            question = f'What is {a} {spoken[op]} {b}? Answer with the equation only, like "2 + 2 = 4".'
            prompt = [{"role": "user", "content": question}]
            truth = f"{a} {op} {b} = {result}"
            verl.append(
                {
                    "data_source": "rxrl/arithmetic",
                    "prompt": prompt,
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": truth},
                    "extra_info": {"split": split, "index": index, "question": question},
                }
            )
            trl.append({"prompt": prompt, "ground_truth": truth})
        os.makedirs(os.path.join(args.out, "verl"), exist_ok=True)
        Dataset.from_list(verl).to_parquet(os.path.join(args.out, "verl", f"{split}.parquet"))
        dataset = Dataset.from_list(trl)
        if split == "test":
            dataset.to_parquet(os.path.join(args.out, "trl", "test.parquet"))
            continue
        os.makedirs(os.path.join(args.out, "trl", "train"), exist_ok=True)
        for k in range(args.shards):
            shard = dataset.shard(num_shards=args.shards, index=k, contiguous=True)
            shard.to_parquet(os.path.join(args.out, "trl", "train", f"train-{k:05d}-of-{args.shards:05d}.parquet"))
    print(f"wrote {len(splits['train'])} train and {len(splits['test'])} test questions under {args.out}/verl and {args.out}/trl")


if __name__ == "__main__":
    main()
