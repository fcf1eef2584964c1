"""docs/figures/ holds only figures the docs cite: the current run of each table, nothing superseded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"


def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def cited(name: str, text: str) -> bool:
    """Whether a figure file is cited: by a `<!-- figure: STEM -->` marker or a link naming `figures/NAME`.

    A data file (`STEM.json`, `STEM.runs.jsonl`) is cited with its table `STEM.md`.
    """
    stem = name.split(".", 1)[0]
    if re.search(rf"<!-- figure: {re.escape(stem)} -->", text):
        return True
    if f"figures/{name}" in text:
        return True
    return not name.endswith(".md") and cited(f"{stem}.md", text)


def test_cited_reads_markers_links_and_data_files():
    text = "<!-- figure: vad -->\n[x](figures/pack-english.md)\n"
    assert cited("vad.md", text) and cited("vad.json", text) and cited("pack-english.md", text)
    assert cited("pack-english.json", text) and not cited("pack-longform.md", text)
    assert not cited("batch.md", "[docs/batch.md](docs/batch.md)")  # a doc of the same name is not the figure


@pytest.mark.parametrize("name", sorted(p.name for p in FIGURES.iterdir()))
def test_every_figure_file_is_cited(name):
    assert cited(name, _docs_text()), (
        f"docs/figures/{name} is cited by no doc (README.md, docs/*.md): cite it, or `git rm` it if a newer run "
        "replaced it (git history keeps it)")
