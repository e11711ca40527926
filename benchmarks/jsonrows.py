"""The benchmarks' JSON output: one row per line on stdout, optionally appended to a file as well."""

from __future__ import annotations

import json
from pathlib import Path


def emitter(out: Path | None):
    """emit(row): print the row as one JSON line (flushed) and append it to `out` when given."""

    def emit(row: dict) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if out is not None:
            with open(out, "a") as fh:
                fh.write(line + "\n")

    return emit
