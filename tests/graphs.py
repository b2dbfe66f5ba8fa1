"""CUDA-graph helpers of the GPU tests: capture an op in a CUDA graph, replay it on new inputs."""

from __future__ import annotations

from typing import Callable, Sequence

import torch


class GraphedCall:
    """``fn(*inputs)`` captured once in a CUDA graph over static input buffers.

    Calling it copies fresh tensors into those buffers and replays the graph, exactly what a
    serving engine does each decode step; the returned outputs are the captured (static) ones.
    Warm-up runs happen on a side stream before capture, so compilation and the caching
    allocator's first allocations stay out of the graph.
    """

    def __init__(self, fn: Callable[..., object], *inputs: torch.Tensor, warmup_runs: int = 2):
        self.inputs = tuple(t.clone() for t in inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup_runs):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*self.inputs)

    def __call__(self, *inputs: torch.Tensor):
        for static, fresh in zip(self.inputs, inputs):
            static.copy_(fresh)
        self.graph.replay()
        return self.outputs


def capture_graph(fn: Callable[..., object], *inputs: torch.Tensor, warmup_runs: int = 2) -> GraphedCall:
    """Capture ``fn(*inputs)`` in a CUDA graph; see ``GraphedCall``."""
    return GraphedCall(fn, *inputs, warmup_runs=warmup_runs)


def replay_matches(graphed: GraphedCall, fresh_inputs: Sequence[Sequence[torch.Tensor]], reference: Callable) -> int:
    """Replay on each input set and compare every output with ``reference(*inputs)`` exactly.

    Returns the number of replays checked; raises AssertionError naming the first mismatch."""
    for step, inputs in enumerate(fresh_inputs):
        got = graphed(*inputs)
        torch.cuda.synchronize()
        want = reference(*inputs)
        got = got if isinstance(got, (tuple, list)) else (got,)
        want = want if isinstance(want, (tuple, list)) else (want,)
        for i, (g, w) in enumerate(zip(got, want)):
            if not torch.equal(g.cpu(), w.cpu()):
                raise AssertionError(f"replay {step}: output {i} differs from the reference")
    return len(fresh_inputs)
