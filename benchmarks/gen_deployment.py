"""``python benchmarks/gen_deployment.py``: write a generated deployment instance file (the
generators live in :mod:`optimizer.deployment.generate`)."""
from __future__ import annotations

from pathlib import Path

import yaml

from optimizer.deployment.generate import (AZURE_CONV, CONTEXTS, NEW_TOKENS, ROOT, generate,  # noqa: F401
                                           generate_azure, generate_batched, generate_mixed)


def main(argv=None) -> None:
    """Print a generated instance as YAML: ``python -m benchmarks.gen_deployment mixed 200 16
    --seed 0`` (``six-types``, ``batched`` or ``mixed``; ``--types``, ``--fraction`` and
    ``--max-batch`` (0: no limit) for ``mixed``)."""
    import click

    @click.command(help="Print a generated deployment instance (YAML) on stdout.")
    @click.argument("kind", type=click.Choice(["six-types", "batched", "mixed"]))
    @click.argument("sessions", type=click.IntRange(min=1))
    @click.argument("servers", type=click.IntRange(min=1))
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--types", type=click.IntRange(min=1), default=None, help="mixed: session types (default: all distinct)")
    @click.option("--fraction", type=click.FloatRange(0, 1), default=0.8, show_default=True,
                  help="mixed: share of sessions required on time")
    @click.option("--max-batch", type=click.IntRange(min=0), default=1, show_default=True,
                  help="mixed: batch limit (0: no limit but memory)")
    def cli(kind, sessions, servers, seed, types, fraction, max_batch):
        if kind == "six-types":
            raw = generate(sessions, servers, seed)
        elif kind == "batched":
            raw = generate_batched(sessions, servers, seed)
        else:
            raw = generate_mixed(sessions, servers, seed, types, fraction, max_batch or None)
        click.echo(yaml.safe_dump(raw, sort_keys=False))

    cli.main(args=argv, prog_name="python -m benchmarks.gen_deployment", standalone_mode=True)


if __name__ == "__main__":
    main()
