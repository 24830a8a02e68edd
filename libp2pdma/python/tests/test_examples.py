"""Runs every script in ``examples/`` as its own process, at a small size,
and checks that it exits 0 and reports that its checks passed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: For each example: the arguments of a small run, and the line its output
#: has when every check passed.
RUNS: dict[str, tuple[list[str], str]] = {
    "load_weights.py": ([], "(identical to safetensors.torch.load_file)"),
    "dataloader.py": (
        ["--samples", "256", "--batch", "32", "--workers", "2", "--check"],
        "checks:  passed",
    ),
}

TIMEOUT_S = 300


def test_every_example_has_a_run() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts, f"no examples in {EXAMPLES}"
    assert scripts == sorted(RUNS), "an example without a run in RUNS, or a run without its example"


@pytest.mark.parametrize("script", sorted(RUNS))
def test_example_runs(script: str, tmp_path: Path) -> None:
    args, passed = RUNS[script]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    report = f"{script} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert passed in proc.stdout, report
