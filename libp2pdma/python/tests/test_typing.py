"""The type stubs match the extension, and the package type-checks."""

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=HERE.parent)


def test_the_stubs_match_the_extension():
    """stubtest imports the extension and compares every name, signature
    and default with _p2pdma.pyi."""
    r = run("mypy.stubtest", "p2pdma._p2pdma", "--allowlist", str(HERE / "stubtest-allowlist.txt"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_package_type_checks():
    r = run("mypy", "--no-incremental", "-p", "p2pdma")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_program_using_the_api_type_checks_strictly(tmp_path):
    prog = tmp_path / "use.py"
    prog.write_text(
        "import asyncio\n"
        "from typing import Any\n"
        "import p2pdma\n"
        "\n"
        "class DeviceArray:\n"
        "    @property\n"
        "    def __cuda_array_interface__(self) -> dict[str, Any]:\n"
        "        return {}\n"
        "\n"
        "def on_gpu(f: p2pdma.File) -> int:\n"
        "    gpu = p2pdma.Memory.cuda(4096, ordinal=0)\n"
        "    cai: dict[str, Any] = gpu.view(0, 16).__cuda_array_interface__\n"
        "    try:\n"
        "        return f.read(DeviceArray()) + f.read(gpu) + len(cai)\n"
        "    except p2pdma.CudaUnavailableError as e:\n"
        "        return e.errno or 0\n"
        "\n"
        "async def main(path: str) -> int:\n"
        "    mem = p2pdma.Memory.host(4096)\n"
        "    with p2pdma.File(path) as f:\n"
        "        n: int = f.read(mem, 4096)\n"
        "        m: int = await f.pread(bytearray(10), file_offset=3)\n"
        "        counts: list[int] = f.pread_batch([(bytearray(1), 0)]).wait()\n"
        "        path_name, why = f.path_for(mem)\n"
        "    stats = p2pdma.stats()\n"
        "    return n + m + sum(counts) + stats['bounce']['bytes'] + len(path_name + why)\n"
        "\n"
        "print(asyncio.run(main('/etc/hostname')))\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text("import p2pdma\nx: str = p2pdma.File('x').read(bytearray(1))\n")
    assert run("mypy", "--strict", "--no-incremental", str(prog)).returncode == 0
    r = run("mypy", "--strict", "--no-incremental", str(bad))
    assert r.returncode != 0 and "incompatible" in r.stdout.lower()
