"""Pass 0: read an ONNX model (a path or a ``ModelProto``) and check it; every failure is one FrontendError line."""

from __future__ import annotations

import os

from stepsim.base.errors import FrontendError


def onnx_module():
    """The ``onnx`` package, imported on first use (it is an extra: ``pip install 'stepsim[onnx]'``)."""
    try:
        import onnx
    except ImportError:
        raise FrontendError("the ONNX front end needs the onnx package: pip install 'stepsim[onnx]'") from None
    return onnx


def load_model(source):
    """The checked ``onnx.ModelProto`` of ``source`` (a path or a ModelProto)."""
    onnx = onnx_module()
    if isinstance(source, onnx.ModelProto):
        model, where = source, f"model {source.graph.name!r}"
    elif isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        if not os.path.exists(where):
            raise FrontendError(f"{where}: no such ONNX file")
        if not os.path.isfile(where):  # a folder, a named pipe or a device: reading it could block or never end
            kind = "a folder" if os.path.isdir(where) else "not a regular file (a pipe, socket or device)"
            raise FrontendError(f"{where}: {kind}, not an ONNX file")
        try:
            model = onnx.load(where)
        except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-derived or ValueError: all mean "not ONNX"
            raise FrontendError(f"{where}: not a readable ONNX model ({_first_line(exc)})") from None
    else:
        raise FrontendError(f"from_onnx takes a path or an onnx.ModelProto, got {type(source).__name__}")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx.checker.ValidationError, or a C++ error for a truncated file
        raise FrontendError(f"{where}: invalid ONNX model ({_first_line(exc)})") from None
    return model


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
