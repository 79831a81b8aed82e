"""Class labels in the shapes exporters ship them, read into one name per class index.

    read_labels(Path("labels.txt"))     # one name a line
    read_labels(Path("classes.csv"))    # index,name (a header line is skipped)
    read_labels(Path("classes.json"))   # ["tench", ...] or {"0": "tench"} or Keras' {"0": ["n01440764", "tench"]}
    read_labels(Path("synsets.txt"))    # "n01440764 tench, Tinca tinca": the first name

Triton's classification extension reads `labels.txt`, one name a line in index order:
the build writes that, whatever it was given.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

SYNSET_LINE = re.compile(r"^n\d{8}\s+(.+)$")


def read_labels(path: Path) -> list[str]:
    """One name per class index; a ValueError naming the file and what is wrong."""
    text = Path(path).read_text()
    if Path(path).suffix == ".json" or text.lstrip().startswith(("[", "{")):
        labels = _from_json(path, text)
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        labels = _from_lines(path, lines)
    if not labels:
        raise ValueError(f"{path}: no labels in it")
    return labels


def _from_json(path: Path, text: str) -> list[str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    if isinstance(data, list):
        return [_name(path, value) for value in data]
    if isinstance(data, dict):
        return _indexed(path, {_index(path, key): _name(path, value) for key, value in data.items()})
    raise ValueError(f"{path}: a JSON list of names or an object of index -> name, not {type(data).__name__}")


def _from_lines(path: Path, lines: list[str]) -> list[str]:
    if all(SYNSET_LINE.match(line) for line in lines):
        return [SYNSET_LINE.match(line).group(1).split(",")[0].strip() for line in lines]
    rows = list(csv.reader(lines))
    if all(len(row) == 2 for row in rows) and all(row[0].strip().isdigit() for row in rows[1:]):
        body = rows[1:] if not rows[0][0].strip().isdigit() else rows  # a header line
        return _indexed(path, {_index(path, index): name.strip() for index, name in body})
    return lines


def _indexed(path: Path, names: dict[int, str]) -> list[str]:
    missing = sorted(set(range(len(names))) - names.keys())
    if missing:
        raise ValueError(f"{path}: class indices must run 0..{len(names) - 1}; missing {missing[:5]}")
    return [names[index] for index in range(len(names))]


def _index(path: Path, key) -> int:
    try:
        return int(key)
    except ValueError:
        raise ValueError(f"{path}: {key!r} is not a class index") from None


def _name(path: Path, value) -> str:
    """A name, or Keras' [synset, name] pair's name."""
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value[-1]
    if isinstance(value, str):
        return value
    raise ValueError(f"{path}: {value!r} is not a class name")
