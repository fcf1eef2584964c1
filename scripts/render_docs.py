"""Refresh the docs from the figure files that the benchmark scripts write.

    python scripts/render_docs.py            # rewrite README.md and docs/*.md in place
    python scripts/render_docs.py --check    # exit 1 if anything would change; writes nothing

In README.md and every docs/*.md, the lines between a line `<!-- figure: NAME -->` and the next line
`<!-- /figure -->` are replaced by the content of docs/figures/NAME.md. A marker that names a missing figure
file, or that is never closed, is reported and the exit status is 1. Writes no figure files itself.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchlib import REPO

OPEN = re.compile(r"<!-- figure: (\S+) -->")
CLOSE = "<!-- /figure -->"


def render(text: str, figures: Path) -> tuple[str, list[str]]:
    """`text` with every figure block refilled from `figures`, and the problems found."""
    lines, out, problems = text.splitlines(keepends=True), [], []
    index = 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        found = OPEN.fullmatch(line.strip())
        if not found:
            continue
        end = next((i for i in range(index, len(lines)) if lines[i].strip() == CLOSE), None)
        name = found.group(1)
        if end is None:
            problems.append(f"line {index}: `{name}` has no closing {CLOSE}")
            continue
        source = figures / f"{name}.md"
        if not source.is_file():
            problems.append(f"line {index}: no figure file docs/figures/{name}.md")
            out.extend(lines[index:end])  # left as it is
        else:
            content = source.read_text()
            out.append(content if content.endswith("\n") else content + "\n")
        index = end  # the closing line is copied on the next turn
    return "".join(out), problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a doc is out of date; write nothing")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root (default: this checkout)")
    parser.add_argument("docs", nargs="*", type=Path, help="only these files (default: README.md and docs/*.md)")
    args = parser.parse_args()
    root = args.root.resolve()
    figures = root / "docs" / "figures"
    docs = args.docs or [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    failed = False
    for doc in docs:
        if not doc.is_file():
            continue
        text = doc.read_text()
        new, problems = render(text, figures)
        for problem in problems:
            print(f"{doc}: {problem}", file=sys.stderr)
        failed |= bool(problems)
        if new != text:
            if args.check:
                print(f"{doc}: out of date (run python scripts/render_docs.py)", file=sys.stderr)
                failed = True
            else:
                doc.write_text(new)
                print(f"{doc}: updated", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
