"""Rebuild `asr/distill/corpus.txt`, the built-in text that `asr distill --tts` speaks.

Sentences of English prose from the Python standard library's documentation (the `pydoc_data` topics) and
docstrings (Python Software Foundation License), filtered to plain words a synthesiser reads as written:
6-30 words, letters and ordinary punctuation only, no code. Parsed with `ast`, nothing is imported. Run with
the Python whose library to read:

    python scripts/make_draft_corpus.py

Measures nothing and writes no figure files; it writes the corpus only.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sysconfig
from pathlib import Path

from benchlib import REPO

OUT = REPO / "asr" / "distill" / "corpus.txt"
PLAIN = re.compile(r"[A-Z][A-Za-z ,.;:'?!-]+[.?!]")
LIMIT = 12000


def sentences(text: str) -> list[str]:
    text = re.sub(r"\s+", " ", text)
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        words = sentence.split()
        if 6 <= len(words) <= 30 and PLAIN.fullmatch(sentence) and not re.search(r"\b[a-z]+_[a-z]+\b|\.\w", sentence):
            found.append(sentence)
    return found


def docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    return [doc for n in nodes if (doc := ast.get_docstring(n))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the corpus")
    args = parser.parse_args()
    import pydoc_data.topics

    found = [s for text in pydoc_data.topics.topics.values() for s in sentences(text)]
    library = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(library.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts or "idlelib" in path.parts:
            continue
        for doc in docstrings(path):
            found += sentences(doc)
    unique = sorted(set(found))
    random.Random(0).shuffle(unique)
    args.out.write_text("\n".join(unique[:LIMIT]) + "\n")
    print(f"{min(len(unique), LIMIT)} sentences of {len(unique)} -> {args.out}")


if __name__ == "__main__":
    main()
