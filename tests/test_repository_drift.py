"""The committed model repository is exactly what build_pipelines.py generates."""

import subprocess
import sys

from tests.conftest import MODEL_REPOSITORY, PROJECT_ROOT


def committed_files():
    """{path relative to the repository: content} as committed (the index), so that
    `make test`, which rebuilds the working tree first, still sees a drift."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--", "model_repository"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    files = {}
    for path in filter(None, listed):
        content = subprocess.run(["git", "show", f":{path}"], cwd=PROJECT_ROOT, capture_output=True, check=True).stdout
        files[path.removeprefix("model_repository/")] = content
    return files


def generated_files(out):
    subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "build_pipelines.py"), "build", "--out", str(out)],
        check=True,
        cwd=PROJECT_ROOT,
        capture_output=True,
    )
    ignored = (
        subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin", "-z"],
            input="\0".join(f"model_repository/{p.relative_to(out)}" for p in out.rglob("*")).encode(),
            cwd=PROJECT_ROOT,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in out.rglob("*")
        if path.is_file() and f"model_repository/{path.relative_to(out)}" not in ignored
    }


def test_committed_repository_matches_generated(tmp_path):
    committed = committed_files()
    generated = generated_files(tmp_path / "repository")
    assert sorted(committed) == sorted(generated)
    drifted = [path for path in generated if generated[path] != committed[path]]
    assert drifted == [], f"run `make build` and commit: {drifted}"
    assert MODEL_REPOSITORY.exists()
