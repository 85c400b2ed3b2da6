"""Send the same /infill requests, greedy, to llama-server and to `candlewick serve`, and print
whether they agree (docs/server.md, "Code completion and saved slots").

    .venv/bin/python scripts/infill_side_by_side.py http://127.0.0.1:18581 http://127.0.0.1:18582

Three inputs: repository context with a typed prompt ("repo"), a prefix and suffix alone
("plain"), and inputs longer than every budget ("budgets": the prefix, the suffix and the extra
chunks are all cut). For each: the same prompt text (`prompt`, the special tokens as text),
the same number of prompt tokens, the same middle, the tokens generated and why they stopped.
Exit code 0 when every prompt and middle agree, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

CASES: dict[str, dict[str, Any]] = {
    "repo": {
        "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
        "input_prefix": "def add(a, b):\n    ",
        "input_suffix": "\n\nprint(add(1, 2))\n",
        "prompt": "return",
        "n_predict": 32,
    },
    "plain": {
        "input_prefix": "import math\n\ndef area(r):\n"
        '    """The area of a circle of radius r."""\n',
        "input_suffix": "\n\nprint(area(2.0))\n",
        "n_predict": 32,
    },
    "budgets": {
        "input_extra": [
            {"filename": f"m{i}.py", "text": f"def f{i}(x):\n    return x * {i}\n" * 8}
            for i in range(6)
        ],
        "input_prefix": "".join(f"def g{i}(x):\n    return x + {i}\n\n" for i in range(60)),
        "input_suffix": "".join(f"print(g{i}(1))\n" for i in range(60)),
        "prompt": "def g60(x):\n    ",
        "n_predict": 24,
    },
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("llama_server", help="llama-server's base URL")
    ap.add_argument("candlewick", help="candlewick serve's base URL")
    args = ap.parse_args()
    agree = True
    print("| input | prompt tokens | same prompt | same middle | generated (llama-server, ours) |")
    print("|---|---|---|---|---|")
    for name, body in CASES.items():
        got = []
        for url in (args.llama_server, args.candlewick):
            r = httpx.post(f"{url}/infill", json={**body, "temperature": 0}, timeout=600)
            r.raise_for_status()
            got.append(r.json())
        theirs, ours = got
        same_prompt = theirs["prompt"] == ours["prompt"]
        same_middle = theirs["content"] == ours["content"]
        agree = agree and same_prompt and same_middle
        print(
            f"| {name} | {theirs['tokens_evaluated']}, {ours['tokens_evaluated']} | "
            f"{same_prompt} | {same_middle}: {json.dumps(ours['content'])} | "
            f"{theirs['tokens_predicted']} {theirs['stop_type']}, "
            f"{ours['tokens_predicted']} {ours['stop_type']} |"
        )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
