"""``stepsim.frontend``: lower an ONNX model to a STeP graph (issue 33).

``from_onnx(path_or_ModelProto, *, tiling=..., hardware=...) -> Workload``; the workload's graph loads the
model's inputs and stores its outputs under their ONNX names, so
``simulate(w, functional=True, inputs={name: array}).outputs[name]`` compares directly with onnxruntime.

One module per pass: :mod:`~stepsim.frontend.load` (read and check), :mod:`~stepsim.frontend.shapes` (bind
dims, infer shapes, fold constants), :mod:`~stepsim.frontend.patterns` (SiLU and friends back to one op),
:mod:`~stepsim.frontend.attention` (gpt-oss's masks and sinks), :mod:`~stepsim.frontend.mla` (MLA's split heads),
:mod:`~stepsim.frontend.moe` with :mod:`~stepsim.frontend.group_gate` (MoE blocks, DeepSeek-V3's router),
:mod:`~stepsim.frontend.layouts` (layout assignment),
:mod:`~stepsim.frontend.converters` (converter insertion), :mod:`~stepsim.frontend.fusion` (fuse or spill each
edge), :mod:`~stepsim.frontend.spill` (a spilled edge as off-chip traffic), :mod:`~stepsim.frontend.emit` (STeP
operators). ``onnx`` is imported only when a model is lowered.
"""

from stepsim.frontend.lower import FrontendReport, from_onnx
from stepsim.frontend.moe import RoutingTrace

__all__ = ["FrontendReport", "RoutingTrace", "from_onnx"]
