"""Model folders on disk: a config.pbtxt and the files of a version folder, each
written only when its content changes, and atomically (a server loading the
repository meanwhile sees the old file or the new one, never half of one)."""

from __future__ import annotations

import os
from pathlib import Path

from tritonstack.build.model_config import ModelConfig
from tritonstack.repository_files import CONFIG_FILENAME, VERSION


def write_model_folder(
    repository: Path, config: ModelConfig, files: dict[str, bytes | str], version: str = VERSION
) -> list[Path]:
    """One model of any kind: its config.pbtxt, and `files` (names relative to the
    version folder, text or bytes). For repositories that are not presets; the files
    that changed."""
    model_dir = Path(repository) / config.name
    changed = write_config(model_dir, config)
    (model_dir / version).mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        changed += write_if_changed(
            model_dir / version / name, content.encode() if isinstance(content, str) else content
        )
    return changed


def write_config(model_dir: Path, config: ModelConfig) -> list[Path]:
    return write_if_changed(model_dir / CONFIG_FILENAME, config.to_pbtxt().encode())


def write_if_changed(path: Path, content: bytes) -> list[Path]:
    if path.exists() and path.read_bytes() == content:
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, lambda partial: partial.write_bytes(content))
    return [path]


def replace_atomically(path: Path, write) -> None:
    """Write next to `path` then rename: a server loading the repository meanwhile
    sees the old file or the new one, never half of one."""
    partial = path.with_name(f".{path.name}.partial")
    write(partial)
    os.replace(partial, path)
