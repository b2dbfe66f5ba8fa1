import os

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
    # The kernels' disk cache (the cache's own tests point it at a folder of their own). On a GPU
    # the run's processes (the pytest-xdist workers) share one folder, so each configuration
    # compiles at most once per run rather than once per worker: $TORCH_SPARSE_DECODE_CACHE where
    # it names one (kernels built ahead of time: docs/cold_start.md), else a fresh one. Without a
    # GPU nothing is cached.
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        os.environ["TORCH_SPARSE_DECODE_CACHE"] = worker.get("tsd_cache", "0")
    elif torch.cuda.is_available() and os.environ.get("TORCH_SPARSE_DECODE_CACHE", "0") not in ("", "0"):
        pass
    elif torch.cuda.is_available():
        import tempfile

        config._tsd_cache = tempfile.TemporaryDirectory(prefix="tsd-test-kernels-")
        os.environ["TORCH_SPARSE_DECODE_CACHE"] = config._tsd_cache.name
    else:
        os.environ["TORCH_SPARSE_DECODE_CACHE"] = "0"
    # Without a GPU, CuTe DSL compiles for its default target (SM100); ours is Hopper.
    if not torch.cuda.is_available():
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        # Triton kernels run on CPU tensors in the interpreter (set before triton.jit runs).
        os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: each worker gets the controller's kernel folder."""
    node.workerinput["tsd_cache"] = os.environ.get("TORCH_SPARSE_DECODE_CACHE", "0")


def pytest_unconfigure(config):
    cache = getattr(config, "_tsd_cache", None)
    if cache is not None:
        cache.cleanup()
