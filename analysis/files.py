"""Reading a result file that may be committed gzipped.

``results/`` stores its large text files (``curves.csv``, ``metrics.csv``, ``metrics.jsonl``,
logs) as ``<name>.gz`` (``gzip -9 -n``) to keep the repository small; new runs still write plain
files. These readers take a file's plain path and open whichever form exists, the plain one first.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, Any

import pandas as pd


def resolve(path: str | Path) -> Path:
    """``path`` if it exists, else ``path.gz`` if that exists, else ``path`` (so a caller's
    "not found" names the plain file)."""
    path = Path(path)
    if path.exists():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if gz.exists() else path


def exists(path: str | Path) -> bool:
    """Whether ``path`` or ``path.gz`` exists."""
    return resolve(path).exists()


def open_text(path: str | Path, newline: str | None = None) -> IO[str]:
    """``path`` (or ``path.gz``, decompressed) opened for reading text, UTF-8."""
    p = resolve(path)
    if p.suffix == ".gz":
        return gzip.open(p, "rt", encoding="utf-8", newline=newline)
    return p.open(encoding="utf-8", newline=newline)


def read_text(path: str | Path) -> str:
    """The whole text of ``path`` (or ``path.gz``)."""
    with open_text(path) as f:
        return f.read()


def read_csv(path: str | Path, **kwargs: Any) -> pd.DataFrame:
    """``pandas.read_csv`` of ``path`` (or ``path.gz``: pandas decompresses by the suffix)."""
    return pd.read_csv(resolve(path), **kwargs)
