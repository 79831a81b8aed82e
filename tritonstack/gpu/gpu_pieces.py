"""DALI for a GPU machine that has no network and takes little at a time: the pinned
DALI wheels installed here into one folder for that machine's Python, packed as one
xz stream, cut into pieces; and, there, the pieces joined and unpacked.

    python -m tritonstack.gpu.gpu_pieces pack --out .gpu/pieces   # here (--serving: and tritonserver)
    python3 -m tritonstack.gpu.gpu_pieces join .gpu/pieces /tmp/site   # there

The DALI wheel is 405 MB as deflate and 818 MB unpacked, mostly CUDA kernels for
every GPU generation; xz packs it into about a third of the wheel, so it travels in
a few pieces instead of seven (docs/performance.md, "On a GPU"). `join` needs only
Python's standard library: the GPU machine has no DALI, no xz and no pip index.
"""

from __future__ import annotations

import argparse
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# What `import nvidia.dali` and its GPU decoders need beyond what a CUDA machine with
# PyTorch has (NumPy, six, packaging): versions from constraints.txt.
WHEELS = (
    "nvidia-dali-cuda120",
    "nvidia-nvimgcodec-cu12",
    "nvidia-nvjpeg-cu12",
    "nvidia-nvjpeg2k-cu12",
    "nvidia-nvtiff-cu12",
    "nvidia-libnvcomp-cu12",
    "astunparse",
    "gast",
    "makefun",
    "optree",
    "libcst",
    "nvtx",
)
# With --serving, what `tritonstack serve` and its gRPC client need beyond that: the
# tritonserver binary in nvidia-pytriton, the Triton clients, the versions of gRPC and
# protobuf tritonclient's generated code asks for, and the NumPy the project pins
# (nvidia-pytriton 0.7.0 asks for NumPy below 2; the GPU machine has 2.x).
SERVING_WHEELS = (
    "numpy",
    "nvidia-pytriton",
    "tritonclient",
    "python-rapidjson",
    "geventhttpclient",
    "gevent",
    "greenlet",
    "zope.event",
    "zope.interface",
    "brotli",
    "grpcio",
    "protobuf",
    "tenacity",
    "pyzmq",
    "sh",
    "importlib_metadata",
)
PIECE_MIB = 56  # each call to the GPU machine carries at most 64 MiB with the checkout
STREAM_NAME = "site.tar.xz"
_PLATFORMS = tuple(f"manylinux_2_{glibc}_x86_64" for glibc in (35, 28, 27, 17)) + ("manylinux2014_x86_64",)
_OTHER_ABI = re.compile(r"\.cpython-3(\d+)t?-x86_64-linux-gnu\.so$")


def pinned(constraints: Path, names: tuple[str, ...] = WHEELS) -> list[str]:
    """`name==version` for each name, as constraints.txt pins it."""
    pins = dict(
        line.split("==", 1)
        for line in constraints.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    missing = [name for name in names if name not in pins]
    if missing:
        raise SystemExit(f"constraints.txt pins no version of {', '.join(missing)}")
    return [f"{name}=={pins[name].strip()}" for name in names]


def install_for(python_version: str, requirements: list[str], target: Path) -> None:
    """pip installs the wheels for that machine's Python into `target`, no dependencies
    resolved (the list above is the whole set)."""
    platforms = [arg for platform in _PLATFORMS for arg in ("--platform", platform)]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--only-binary=:all:"]
        + ["--python-version", python_version, "--implementation", "cp", *platforms, "--target", str(target)]
        + requirements,
        check=True,
    )


def drop_other_pythons(site: Path, python_version: str) -> int:
    """Removes extension modules built for other CPython versions (DALI ships eight):
    returns how many bytes that saved."""
    minor = python_version.split(".")[1]
    saved = 0
    for path in site.rglob("*.so"):
        match = _OTHER_ABI.search(path.name)
        if match and (match.group(1) != minor or path.name.endswith(f"3{minor}t-x86_64-linux-gnu.so")):
            saved += path.stat().st_size
            path.unlink()
    return saved


def pack(site: Path, out: Path, piece_mib: int = PIECE_MIB) -> list[Path]:
    """The folder as one tar.xz stream, cut into `piece_mib` pieces."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{STREAM_NAME}.*"):
        old.unlink()
    tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
    split = subprocess.Popen(
        ["split", "-b", f"{piece_mib}M", "-d", "-a", "2", "-", str(out / f"{STREAM_NAME}.")],
        stdin=subprocess.PIPE,
    )
    subprocess.run(_xz(), stdin=tar.stdout, stdout=split.stdin, check=True)
    split.stdin.close()
    if tar.wait() or split.wait():
        raise SystemExit("packing failed")
    return sorted(out.glob(f"{STREAM_NAME}.*"))


def _xz() -> list[str]:
    """xz with every core; where xz is not installed, Python's lzma (one core, the same format)."""
    if shutil.which("xz"):
        return ["xz", "-6", "-T0", "-c"]
    script = "import lzma, shutil, sys\nwith lzma.open(sys.stdout.buffer, 'w', preset=6) as out:\n"
    return [sys.executable, "-c", script + "    shutil.copyfileobj(sys.stdin.buffer, out)"]


class _Joined:
    """The pieces read back to back as one file."""

    def __init__(self, pieces: list[Path]):
        self._pieces = iter(pieces)
        self._file = open(next(self._pieces), "rb")

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        while not data or (size > 0 and len(data) < size):
            following = next(self._pieces, None)
            if following is None:
                return data
            self._file.close()
            self._file = open(following, "rb")
            data += self._file.read(size - len(data) if size > 0 else -1)
        return data


def join(pieces_dir: Path, target: Path) -> None:
    """Unpacks the pieces into `target` (for PYTHONPATH), refusing a missing piece."""
    pieces = sorted(pieces_dir.glob(f"{STREAM_NAME}.*"))
    numbers = [int(piece.suffix[1:]) for piece in pieces]
    if not pieces or numbers != list(range(len(pieces))):
        raise SystemExit(f"{pieces_dir}: pieces {numbers} are not 00 to the last: one is missing")
    with lzma.open(_Joined(pieces)) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        archive.extractall(target, filter="fully_trusted")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tritonstack.gpu.gpu_pieces", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="install the DALI wheels for that Python here and cut them into pieces")
    packing.add_argument("--out", type=Path, default=Path(".gpu/pieces"))
    packing.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default: 3.12)")
    packing.add_argument("--constraints", type=Path, default=Path("constraints.txt"))
    packing.add_argument("--piece-mib", type=int, default=PIECE_MIB)
    packing.add_argument("--serving", action="store_true", help="also what `tritonstack serve` needs (gpu_serve)")
    joining = commands.add_parser("join", help="unpack the pieces into a folder for PYTHONPATH")
    joining.add_argument("pieces", type=Path)
    joining.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    if args.command == "join":
        join(args.pieces, args.target)
        return
    with tempfile.TemporaryDirectory(prefix="gpu-site-") as scratch:
        site = Path(scratch) / "site"
        wheels = WHEELS + SERVING_WHEELS if args.serving else WHEELS
        install_for(args.python_version, pinned(args.constraints, wheels), site)
        saved = drop_other_pythons(site, args.python_version)
        pieces = pack(site, args.out, args.piece_mib)
    total = sum(piece.stat().st_size for piece in pieces) / 2**20
    print(f"{len(pieces)} pieces, {total:.0f} MiB in all ({saved / 2**20:.0f} MiB of other Pythons' modules left out):")
    for piece in pieces:
        print(f"  {piece} {piece.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
