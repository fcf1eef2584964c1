"""`asr models`: the model names this installation knows, and the precisions this machine's CPU computes."""

from __future__ import annotations

import click


@click.command("models")
def models() -> None:
    """List known model names: what each resolves to, whether installed and converted; the draft models shipped
    for `--assistant`."""
    from asr.assist.choose import shipped_drafts
    from asr.assist.draft_model import read_description
    from asr.models.precision import cpu_precisions
    from asr.models.registry import known_models

    rows = [(m.name, "yes" if m.installed else "no", "yes" if m.cached else "no", m.resolves_to)
            for m in known_models()]
    width = max(len(r[0]) for r in rows)
    click.echo(f"{'name':<{width}}  installed  cached  source")
    for name, installed, cached, source in rows:
        click.echo(f"{name:<{width}}  {installed:<9}  {cached:<6}  {source}")
    drafts = shipped_drafts()
    if drafts:
        click.echo("\ndraft models shipped (--assistant NAME, NAME:int8; auto picks them on a CPU):")
        for name, folder in sorted(drafts.items()):
            click.echo(f"  {name} (for {read_description(folder).get('model', '?')})")
    click.echo(f"\n--dtype on this machine's CPU: {', '.join(cpu_precisions())} (auto: float32)")
