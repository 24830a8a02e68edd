"""Loads a safetensors file with p2pdma and checks it against safetensors.

    python load_weights.py                       # writes a small model first
    python load_weights.py model.safetensors     # an existing file
    python load_weights.py model.safetensors --device accel:0

Prints how many tensors and bytes it loaded, how long it took, and the path
the engine took (p2p, nvme-cmd, bounce or direct) with its reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file as reference_load
from safetensors.torch import save_file as reference_save

import p2pdma
from p2pdma.safetensors import load_file


def write_small_model(directory: str) -> str:
    """A small transformer-ish model's weights, some in bfloat16."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(1000, 256),
        torch.nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True),
        torch.nn.LayerNorm(256),
        torch.nn.Linear(256, 1000),
    )
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for k in list(weights)[: len(weights) // 2]:
        weights[k] = weights[k].to(torch.bfloat16)
    path = os.path.join(directory, "model.safetensors")
    reference_save(weights, path, metadata={"format": "pt"})
    return path


def probe(device: str):
    """A small destination like the ones load_file reads into on `device`."""
    if device == "cpu":
        return torch.empty(4096, dtype=torch.uint8)
    if device == "host":
        return p2pdma.Memory.host(4096)
    return p2pdma.Memory.accelerator(4096, index=int(device.split(":", 1)[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="a .safetensors file (default: write a small model)")
    parser.add_argument("--device", default="cpu", help="cpu, host or accel:N (default cpu)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or write_small_model(tmp)

        before = p2pdma.stats()
        start = time.perf_counter()
        try:
            tensors = load_file(path, args.device, progress=args.progress or None)
        except p2pdma.Error as e:
            print(f"load_weights: {e}", file=sys.stderr)
            return 1
        seconds = time.perf_counter() - start
        after = p2pdma.stats()

        reference = reference_load(path)
        assert tensors.keys() == reference.keys(), "different tensor names"
        for name, want in reference.items():
            got = tensors[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(
                got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
            ), f"{name} differs from safetensors'"

        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        moved = {k: after[k]["bytes"] - before[k]["bytes"] for k in ("p2p", "nvme-cmd", "bounce", "direct")}
        taken = ", ".join(f"{k} {v} B" for k, v in moved.items() if v) or "none"
        with p2pdma.File(path) as f:
            route, reason = f.path_for(probe(args.device))

        print(f"file:    {path}")
        print(f"device:  {args.device}")
        print(f"tensors: {len(tensors)} (identical to safetensors.torch.load_file)")
        print(f"bytes:   {nbytes}")
        print(f"seconds: {seconds:.4f} ({nbytes / max(seconds, 1e-9) / 2**20:.1f} MiB/s)")
        print(f"path:    {route} (bytes read by path, header included: {taken})")
        print(f"reason:  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
