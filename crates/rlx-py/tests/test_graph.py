"""rlx.Graph / rlx.Session: build, compile (hybrid and thunks), run, plan."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rlx


def gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def mlp() -> tuple[rlx.Graph, dict]:
    g = rlx.Graph("mlp")
    x = g.input("x", [4, 8])
    w = g.param("w", [8, 16])
    b = g.param("b", [16])
    h = g.add(g.matmul(x, w), b)
    y = g.activation("gelu", h)
    gamma = g.param("gamma", [16])
    beta = g.param("beta", [16])
    z = g.layer_norm(y, gamma, beta, eps=1e-5)
    g.set_outputs([z, y])
    assert (h.shape, h.dtype) == ([4, 16], "f32")
    rng = np.random.default_rng(0)
    params = {
        "w": rng.standard_normal((8, 16), dtype=np.float32) * 0.3,
        "b": rng.standard_normal(16, dtype=np.float32),
        "gamma": rng.standard_normal(16, dtype=np.float32),
        "beta": rng.standard_normal(16, dtype=np.float32),
    }
    return g, params


def numpy_mlp(x: np.ndarray, p: dict) -> tuple[np.ndarray, np.ndarray]:
    y = gelu(x.astype(np.float64) @ p["w"] + p["b"])
    mu = y.mean(-1, keepdims=True)
    var = ((y - mu) ** 2).mean(-1, keepdims=True)
    z = (y - mu) / np.sqrt(var + 1e-5) * p["gamma"] + p["beta"]
    return z, y


@pytest.mark.parametrize("mode", ["hybrid", "thunks"])
def test_mlp_matches_numpy(mode):
    g, p = mlp()
    s = g.compile(mode=mode, params=p)
    x = np.random.default_rng(1).standard_normal((4, 8), dtype=np.float32)
    z, y = s.run({"x": x})
    wz, wy = numpy_mlp(x, p)
    assert z.dtype == np.float32 and z.shape == (4, 16)
    np.testing.assert_allclose(y, wy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(z, wz, rtol=1e-4, atol=1e-4)
    # Non-contiguous input: the logical order is what counts.
    xt = np.asfortranarray(x)
    assert np.array_equal(s.run({"x": xt})[0], z)


def test_plan_shows_the_split():
    g, p = mlp()
    hybrid = g.compile(mode="hybrid", params=p).plan()
    thunks = g.compile(mode="thunks", params=p).plan()
    assert hybrid["mode"] == "hybrid" and thunks["mode"] == "thunks"
    assert hybrid["compiled_segments"] >= 1
    assert thunks["compiled_segments"] == 0 and thunks["segments"] == []
    assert hybrid["dispatches"] < thunks["dispatches"]
    assert hybrid["dispatches_thunks_only"] == thunks["dispatches"]
    seg = hybrid["segments"][0]
    assert seg["nodes"] >= 2 and seg["first"] <= seg["last"]
    assert seg["boundary_outputs"]
    for r in thunks["ranges"]:
        for op in r["ops"]:
            assert op["op"] and op["reason"]


def test_softmax_attention_ops_and_reasons():
    g = rlx.Graph("scores")
    q = g.input("q", [2, 3, 4])
    k = g.input("k", [2, 3, 4])
    kt = g.transpose(k, [0, 2, 1])
    sc = g.softmax(g.matmul(q, kt), axis=-1)
    g.set_outputs([g.reshape(sc, [2, 9])])
    s = g.compile()
    rng = np.random.default_rng(2)
    qa = rng.standard_normal((2, 3, 4), dtype=np.float32)
    ka = rng.standard_normal((2, 3, 4), dtype=np.float32)
    (out,) = s.run({"q": qa, "k": ka})
    logits = qa @ ka.transpose(0, 2, 1)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)).reshape(2, 9), atol=1e-6)
    assert s.plan_stats()["dispatches"] >= 1


def test_constants_and_dtype_errors():
    g = rlx.Graph("consts")
    a = g.input("a", [2, 3])
    c = g.constant(np.array([10.0, 20.0, 30.0], dtype=np.float32))
    g.set_outputs([g.binary("max", g.add(a, c), c)])
    x = np.array([[1, 2, 3], [-40, 5, 6]], dtype=np.float32)
    (out,) = g.compile(mode="thunks").run({"a": x})
    assert out.tolist() == [[11, 22, 33], [10, 25, 36]]
    ints = g.input("ids", [3], dtype="i64")
    with pytest.raises(rlx.GraphError, match="Binary over .*i64.*expected lhs to be f32"):
        g.add(ints, ints)
    with pytest.raises(TypeError, match="float64"):
        g.constant(np.zeros(3))


def test_graph_errors():
    g = rlx.Graph("bad")
    x = g.input("x", [4, 8])
    w = g.param("w", [7, 3])
    with pytest.raises(rlx.GraphError, match="MatMul over"):
        g.matmul(x, w)
    with pytest.raises(rlx.GraphError, match="already has an input or param named \"x\""):
        g.input("x", [1])
    with pytest.raises(ValueError, match="activation \"swishy\": expected one of relu, gelu, gelu_tanh"):
        g.activation("swishy", x)
    with pytest.raises(ValueError, match="dimensions must be non-negative"):
        g.input("y", [-1, 2])
    with pytest.raises(ValueError, match="dtype"):
        g.input("z", [2], dtype="f64")
    with pytest.raises(ValueError, match="softmax axis=5"):
        g.softmax(x, axis=5)
    with pytest.raises(ValueError, match="overflows"):
        g.input("huge", [2**62, 2**62])
    other = rlx.Graph("other")
    o = other.input("o", [4, 8])
    with pytest.raises(rlx.GraphError, match="not a node of graph \"bad\""):
        g.activation("relu", o)
    with pytest.raises(rlx.GraphError, match="no outputs"):
        g.compile()
    with pytest.raises(TypeError):
        g.matmul(x, "not a node")


def test_session_errors():
    g, p = mlp()
    s = g.compile(params={k: v for k, v in p.items() if k != "gamma"})
    x = np.zeros((4, 8), dtype=np.float32)
    with pytest.raises(rlx.ExecutionError, match="gamma"):
        s.run({"x": x})
    s.set_param("gamma", p["gamma"])
    assert len(s.run({"x": x})) == 2
    with pytest.raises(ValueError, match="missing \"x\""):
        s.run({})
    with pytest.raises(ValueError, match="no input \"y\""):
        s.run({"x": x, "y": x})
    with pytest.raises(ValueError, match=r"got shape \[8, 4\], expected \[4, 8\]"):
        s.run({"x": x.T})
    with pytest.raises(TypeError, match="got dtype i64, expected f32"):
        s.run({"x": np.zeros((4, 8), dtype=np.int64)})
    with pytest.raises(TypeError, match="float64"):
        s.run({"x": np.zeros((4, 8))})
    with pytest.raises(TypeError, match="expected a numpy array, got list"):
        s.run({"x": [[0.0] * 8] * 4})
    with pytest.raises(ValueError, match="no param \"nope\""):
        s.set_param("nope", x)
    with pytest.raises(ValueError, match="mode="):
        g.compile(mode="fast")
    with pytest.raises(rlx.RlxError, match="CUDA"):
        g.compile(device="cuda")
    assert s.inputs == [("x", [4, 8], "f32")]
