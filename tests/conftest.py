import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=300, help="cases of the GPU fuzzer (test_fuzz_gpu.py)")
    parser.addoption("--fuzz-seed", type=int, default=0, help="seed of the GPU fuzzer's cases")


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))


def pytest_configure(config):
    # Without a GPU, CuTe DSL compiles for its default target (SM100); ours is Hopper.
    import os

    # Every test compiles what it runs: no kernel comes from an earlier process's disk cache (the
    # cache's own tests point it at a folder of their own).
    os.environ["TORCH_SPARSE_DECODE_CACHE"] = "0"
    if not torch.cuda.is_available():
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        # Triton kernels run on CPU tensors in the interpreter (set before triton.jit runs).
        os.environ.setdefault("TRITON_INTERPRET", "1")
