"""Random and adversarial score rows shared by the tests (all generated on the CPU, seeded)."""

from __future__ import annotations

import torch

INF = float("inf")
NAN = float("nan")

KINDS = (
    "random",
    "all_equal",
    "few_distinct",
    "relu_zeros",
    "signed_zeros",
    "nan_mixed",
    "all_nan",
    "inf_mixed",
    "bf16_plateau",
    "tiny_negative",
)


def scores(kind: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """fp32 tensor of ``shape`` built to stress one aspect of the order."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    if kind == "random":
        return x
    if kind == "all_equal":
        return torch.full(shape, 0.5)
    if kind == "few_distinct":
        return torch.randint(0, 3, shape, generator=gen).float() - 1.0
    if kind == "relu_zeros":
        return torch.relu(x)
    if kind == "signed_zeros":
        zeros = torch.where(torch.rand(shape, generator=gen) < 0.5, -0.0, 0.0)
        return torch.where(torch.rand(shape, generator=gen) < 0.9, zeros, x)
    if kind == "nan_mixed":
        return torch.where(torch.rand(shape, generator=gen) < 0.3, NAN, x)
    if kind == "all_nan":
        return torch.full(shape, NAN)
    if kind == "inf_mixed":
        u = torch.rand(shape, generator=gen)
        x = torch.where(u < 0.1, INF, x)
        x = torch.where((u >= 0.1) & (u < 0.3), -INF, x)
        return torch.where((u >= 0.3) & (u < 0.35), NAN, x)
    if kind == "bf16_plateau":
        return (x * 0.01).to(torch.bfloat16).float()
    if kind == "tiny_negative":
        # fp32 denormals that round to bf16 -0.0 / +0.0, mixed with real zeros.
        tiny = torch.tensor([-1e-45, 1e-45, -0.0, 0.0, -3e-39, 3e-39])
        return tiny[torch.randint(0, len(tiny), shape, generator=gen)]
    raise ValueError(kind)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: -0.0 is not +0.0 and a NaN keeps its payload (values come from the input)."""
    ints = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


import pytest  # noqa: E402

# Every op test runs on the CPU and, marked gpu (skipped without one), on CUDA tensors.
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer full of values no op writes, so an unwritten slot fails the test."""
    if dtype.is_floating_point:
        return torch.full(shape, NAN, dtype=dtype, device=device)
    return torch.full(shape, -7, dtype=dtype, device=device)
