"""CLI subcommands, one module each (auto-discovered by shapeplan.cli)."""
