"""Write a retrieval set from the standard library: each query is the first line of a
function's docstring, its one relevant document that function with the docstring taken
out. Half the functions are long (over ``LONG_CHARS``), so the set shows what cutting
chunks to the model's window does where it applies. BEIR layout, for ``ssindex eval``.

    python benchmarks/docstring_set.py /tmp/docstrings [--queries 500]
    ssindex eval /tmp/docstrings --workdir /tmp/docstrings-work
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
from pathlib import Path

LONG_CHARS = 2000
"""A function this long takes more than all-MiniLM-L6-v2's 256-token window."""
MIN_QUERY_WORDS = 4
DISTRACTORS = 4000
"""Other documented functions in the corpus, besides the queries' own."""


def functions(root: Path) -> list[tuple[str, str]]:
    """(first docstring line, source without the docstring) of every documented function."""
    found: list[tuple[str, str]] = []
    for file in sorted(root.rglob("*.py")):
        if {"site-packages", "test", "tests", "idlelib"} & set(file.parts):
            continue
        try:
            text = file.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            first = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
            if len(first.split()) < MIN_QUERY_WORDS or node.end_lineno is None:
                continue
            docstring = node.body[0]
            kept = lines[node.lineno - 1:docstring.lineno - 1] + \
                lines[(docstring.end_lineno or docstring.lineno):node.end_lineno]
            found.append((first, "\n".join(kept)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    found = functions(Path(sysconfig.get_paths()["stdlib"]))
    unique: dict[str, str] = {}
    for query, source in found:  # a docstring line shared by several functions is ambiguous
        unique[query] = "" if query in unique else source
    pairs = [(q, s) for q, s in unique.items() if s]
    rng = random.Random(0)
    long = [p for p in pairs if len(p[1]) > LONG_CHARS]
    short = [p for p in pairs if len(p[1]) <= LONG_CHARS]
    half = args.queries // 2
    chosen = rng.sample(long, min(half, len(long)))
    chosen += rng.sample(short, args.queries - len(chosen))
    others = [p for p in pairs if p not in set(chosen)]
    docs = chosen + rng.sample(others, min(DISTRACTORS, len(others)))
    rng.shuffle(docs)
    corpus = [{"_id": str(i), "text": s} for i, (_, s) in enumerate(docs)]
    ids = {s: str(i) for i, (_, s) in enumerate(docs)}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps(doc) + "\n" for doc in corpus)
    with open(args.out / "queries.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps({"_id": f"q{i}", "text": q}) + "\n"
                       for i, (q, _) in enumerate(chosen))
    with open(args.out / "qrels.tsv", "w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        out.writelines(f"q{i}\t{ids[s]}\t1\n" for i, (_, s) in enumerate(chosen))
    print(f"{len(corpus)} functions, {len(chosen)} queries ({len(long)} long available) "
          f"in {args.out}")


if __name__ == "__main__":
    main()
