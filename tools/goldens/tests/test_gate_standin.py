"""The LP-VTP-SD stand-in's sampler (tools/goldens/vla_goldens/fixture_graphs.py `grid_sample_matrix`): its
bilinear weights are what ONNX GridSample computes with align_corners=0 and zero padding,
which is `torch.nn.functional.grid_sample(align_corners=False, mode="bilinear",
padding_mode="zeros")`, the upstream grid token sampler's call (the ONNX op mirrors torch's;
the LP-VTP-SD card reports ORT's GridSample against PyTorch at cosine 0.99999999)."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from vla_goldens import fixture_graphs as fg


def onnx_grid_sample(features: np.ndarray, points) -> np.ndarray:
    """features [C, g, g], points [(x, y)] normalized -> [len(points), C] by ONNX GridSample."""
    c, g, _ = features.shape
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=0, mode="linear",
                            padding_mode="zeros")
    graph = helper.make_graph(
        [node], "gs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, g, g]),
         helper.make_tensor_value_info("grid", TensorProto.FLOAT, [1, 1, len(points), 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 1, len(points)])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    grid = np.array(points, np.float32).reshape(1, 1, len(points), 2)
    y = sess.run(None, {"x": features[None].astype(np.float32), "grid": grid})[0]
    return y[0, :, 0, :].T


def test_grid_sample_matrix_is_torchs_bilinear_sampling():
    rng = np.random.default_rng(5)
    g = 4
    features = rng.standard_normal((3, g, g)).astype(np.float32)
    # The fixture's points, plus points near and past the border (zero padding's taps).
    points = fg.SAMPLER_POINTS + [(-0.95, 0.9), (0.99, -0.99), (1.1, 0.0), (0.0, 0.0)]
    ours = fg.grid_sample_matrix(points, g) @ features.reshape(3, g * g).T
    np.testing.assert_allclose(ours, onnx_grid_sample(features, points), rtol=1e-6, atol=1e-6)


def test_the_coarse_sampler_differs_from_torchs_only_off_the_step():
    g = 4
    on_step = [(0.125, -0.375)]  # pixel coordinates 1.75 and 0.75: multiples of 1/16
    np.testing.assert_array_equal(fg.grid_sample_matrix(on_step, g, 1 / 16), fg.grid_sample_matrix(on_step, g))
    off = fg.SAMPLER_POINTS[:2]
    assert not np.array_equal(fg.grid_sample_matrix(off, g, 1 / 16), fg.grid_sample_matrix(off, g))
