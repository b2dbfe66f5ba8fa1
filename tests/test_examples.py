"""examples/dsa_decode_step.py at a small size: eager and torch.compile(fullgraph=True) give the
same output (and, on a GPU, the replayed CUDA graph too)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
import dsa_decode_step  # noqa: E402


def test_dsa_decode_step_runs_in_every_mode():
    torch._dynamo.reset()
    cfg = dsa_decode_step.Config(batch=3, context=300, page_size=16, topk=64, heads=2, latent=16, index_heads=2,
                                 index_dim=16, hidden=32)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    times = dsa_decode_step.run(cfg, device, steps=2)
    assert set(times) == ({"eager", "compiled", "graph"} if device.type == "cuda" else {"eager", "compiled"})
