"""device="cuda" on a machine where no CUDA device can be used.

Every entry point that takes a device (SentenceEmbedder, LlamaModel,
Graph.compile) raises ``rlx.DeviceError`` (an ``rlx.RlxError``) with a
message saying why, and never panics or aborts the interpreter:

- a wheel built without ``--features cuda``: "no CUDA backend";
- a wheel built with it, on a machine without a GPU (or without the CUDA
  driver libraries): "no usable CUDA device" and the backend's reason.

Skipped where a CUDA device is usable (there the calls would load).
"""

import numpy as np
import pytest

import rlx

no_gpu = pytest.mark.skipif(
    rlx.cuda_device_count() > 0, reason="a CUDA device is usable on this machine"
)

DEVICES = ["cuda", "cuda:0", " CUDA:1 "]


def expected_message():
    """What DeviceError says on this build, as a regex."""
    if rlx.HAS_CUDA:
        return r"no usable CUDA device: (no CUDA device|CUDA libraries not found: |cuInit)"
    return r"no CUDA backend"


def test_device_error_is_an_rlx_error():
    assert issubclass(rlx.DeviceError, rlx.RlxError)
    assert isinstance(rlx.HAS_CUDA, bool)
    n = rlx.cuda_device_count()
    assert isinstance(n, int) and n >= 0
    if not rlx.HAS_CUDA:
        assert n == 0


@no_gpu
@pytest.mark.parametrize("device", DEVICES)
def test_embedder_cuda_without_gpu(device):
    with pytest.raises(rlx.DeviceError, match=expected_message()):
        rlx.SentenceEmbedder("minilm", device=device)


@no_gpu
@pytest.mark.parametrize("device", DEVICES)
def test_llama_cuda_without_gpu(device):
    with pytest.raises(rlx.DeviceError, match=expected_message()):
        rlx.LlamaModel("smollm2", device=device, ctx=64)


@no_gpu
def test_graph_compile_cuda_without_gpu():
    g = rlx.Graph("dev")
    x = g.input("x", [2, 3])
    g.set_outputs([g.activation("relu", x)])
    with pytest.raises(rlx.DeviceError, match=expected_message()):
        g.compile(device="cuda")
    # The graph still compiles and runs on the CPU afterwards.
    (y,) = g.compile(device="cpu").run({"x": np.array([[-1, 2, -3], [4, -5, 6]], np.float32)})
    np.testing.assert_array_equal(y, [[0, 2, 0], [4, 0, 6]])


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:-1", "cuda:x", ""])
def test_malformed_device_is_value_error(device):
    with pytest.raises(ValueError, match="expected \"cpu\", \"cuda\" or \"cuda:N\""):
        rlx.SentenceEmbedder("minilm", device=device)
