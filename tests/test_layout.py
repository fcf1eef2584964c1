"""The tree keeps its shape: small files, and imports only from the same or a lower layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asr", "audio", "decoding", "eval")
MAX_LINES = 400
# Modules allowed past MAX_LINES, with their own limit (none since asr/transcription.py's window decoder moved out).
LONGER: dict[str, int] = {}
# Modules in one folder, `__init__.py` aside.
MAX_MODULES = 12

# Lower numbers are lower layers; a module may import from its own layer and below. The longest prefix wins.
LAYERS = {
    "audio": 0, "decoding": 0, "asr.constants": 0, "asr.errors": 0,
    "asr.models": 1,
    "asr": 2,  # the long-form core: transcribe, window, decoder, language, options, results, writers, ...
    "asr.assist": 3,
    "asr.batch": 4,
    "asr.distill": 5, "eval": 5,
    "asr.cli": 6,
    "asr.__init__": 7, "asr.__main__": 7,  # the public facade and `python -m asr`
}


def _layer(module: str) -> int | None:
    matches = [prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")]
    return LAYERS[max(matches, key=len)] if matches else None


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found.append((name, path))
    return found


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_layers_are_known() -> None:
    assert _layer("asr.models.registry") == 1 and _layer("asr.transcription") == 2 and _layer("asr.cli.batch") == 6
    assert _layer("asr.__init__") == 7 and _layer("asr.constants") == 0 and _layer("numpy") is None


@pytest.mark.parametrize("name,path", _modules(), ids=lambda value: str(value) if isinstance(value, str) else "")
def test_imports_go_down_only(name: str, path: Path) -> None:
    own = _layer(name)
    upward = [imported for imported in _imports(path) if (_layer(imported) or 0) > own]
    assert not upward, f"{name} (layer {own}) imports a higher layer: {upward}"


def test_only_the_command_line_imports_click_or_eval() -> None:
    offenders = [name for name, path in _modules()
                 if name.startswith("asr.") and not name.startswith("asr.cli")
                 and any(i == "click" or i.startswith("click.") or i == "eval" or i.startswith("eval.")
                         for i in _imports(path))]
    assert offenders == []


def test_no_file_is_over_400_lines() -> None:
    files = [path for _, path in _modules()] + sorted((ROOT / "tests").glob("*.py")) + sorted(
        (ROOT / "scripts").glob("*.py"))
    long = {name: n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines()))
            > LONGER.get(name := str(p.relative_to(ROOT)), MAX_LINES)}
    assert long == {}


def test_no_folder_has_more_than_twelve_modules() -> None:
    folders: dict[str, int] = {}
    for _, path in _modules():
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(ROOT))
            folders[folder] = folders.get(folder, 0) + 1
    assert {folder: n for folder, n in folders.items() if n > MAX_MODULES} == {}


def _all_imports(name: str, path: Path) -> set[str]:
    """The project's modules `name` imports anywhere (inside functions and TYPE_CHECKING blocks too)."""
    known = {module for module, _ in _modules()}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: -node.level] if path.name != "__init__.py" else name.split(".")[
                    : len(name.split(".")) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            module = candidate.removesuffix(".__init__")
            if f"{module}.__init__" in known:
                module = f"{module}.__init__"
            if module in known and module != name:
                found.add(module)
    return found


def test_no_import_cycle_anywhere() -> None:
    """No module reaches itself through the modules it imports, function-local and TYPE_CHECKING imports included
    (a package's `__init__` counts as a module)."""
    graph = {name: _all_imports(name, path) for name, path in _modules()}
    done: set[str] = set()
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append(trail[trail.index(name):] + [name])
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, trail + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert cycles == []


def test_options_are_never_rewritten_in_place() -> None:
    offenders = [name for name, path in _modules() if "object.__setattr__" in path.read_text(encoding="utf-8")
                 and name.startswith(("asr.options", "asr.cli", "asr.transcription", "asr.window_decoder"))]
    assert offenders == []


def test_docs_tables_are_their_figure_files() -> None:
    """Every table marked `<!-- figure: NAME -->` in the README and docs/ is docs/figures/NAME.md as written."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--check"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_public_api_is_its_functions_whatever_was_imported_before() -> None:
    """`from asr import transcribe` is the function even after the library's own modules are loaded (no
    submodule shares a public name, which would shadow it)."""
    import importlib

    import asr

    for name in asr.__all__:
        assert not (ROOT / "asr" / f"{name}.py").exists(), name
    importlib.import_module("asr.transcription")
    from asr import load_model, make_assistant, transcribe, transcribe_segments

    assert all(callable(f) and not isinstance(f, type(asr)) for f in (load_model, make_assistant, transcribe,
                                                                        transcribe_segments))
