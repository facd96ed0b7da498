"""Compile ONNX graphs into QNN HTP context binaries and run them on the HTP emulator.

Compiling goes through ONNX Runtime's QNN execution provider from onnxruntime-qnn (its
libQnnHtp.so; on x86_64 an HTP emulator) with `ep.context_enable=1` and
`ep.context_embed_mode=0`: beside the wrapper EPContext model `<stem>_ctx.onnx` it writes
the context binary `<stem>_ctx_qnn.bin` for htp_arch 73 / soc_model 77.

The binary's bytes depend on the compiling process's heap layout, so each compile runs in a
fresh child with ASLR off (personality ADDR_NO_RANDOMIZE, as `setarch -R`), one ORT thread,
a fixed minimal environment and the caller's fixed build path (the QNN graph name is hashed
from the model path).

Run as a script, `qnn_ctx.py compile <model.onnx>` is that child.
"""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

HTP_ARCH = "73"
SOC_MODEL = "77"
ADDR_NO_RANDOMIZE = 0x0040000


def qnn_lib_dir() -> Path:
    import onnxruntime_qnn

    return Path(onnxruntime_qnn.get_library_path()).resolve().parent


def _provider_devices():
    import onnxruntime as ort
    import onnxruntime_qnn

    if "QNNExecutionProvider" not in {d.ep_name for d in ort.get_ep_devices()}:
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise RuntimeError("QNNExecutionProvider device not found after registering onnxruntime_qnn")
    return devices


def _provider_options():
    return {
        "backend_path": str(qnn_lib_dir() / "libQnnHtp.so"),
        "htp_arch": HTP_ARCH,
        "soc_model": SOC_MODEL,
    }


def wrapper_paths(model_path: Path):
    wrapper = model_path.with_name(model_path.stem + "_ctx.onnx")
    return wrapper, wrapper.with_name(wrapper.stem + "_qnn.bin")


def _compile_here(model_path: Path) -> None:
    import onnxruntime as ort

    wrapper, binary = wrapper_paths(model_path)
    for stale in (wrapper, binary):
        stale.unlink(missing_ok=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    so.add_session_config_entry("ep.context_file_path", str(wrapper))
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(_provider_devices(), _provider_options())
    session = ort.InferenceSession(str(model_path), sess_options=so)
    del session
    if not binary.is_file():
        raise RuntimeError(f"{model_path}: compile wrote no {binary.name}")


def _no_aslr():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.personality(ADDR_NO_RANDOMIZE) == -1:
        raise OSError(ctypes.get_errno(), "personality(ADDR_NO_RANDOMIZE) failed")


def compile_context(model_path: Path) -> Path:
    """Compiles `model_path` in a fresh ASLR-off child; returns the context binary path."""
    model_path = Path(model_path)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(model_path.parent),
        "LANG": "C",
        "LC_ALL": "C",
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [sys.executable, "-I", str(Path(__file__).resolve()), "compile", str(model_path)]
    # The venv's site-packages are found through sys.executable; -I keeps the child free of
    # user site dirs and PYTHON* variables.
    result = subprocess.run(cmd, env=env, cwd=model_path.parent, preexec_fn=_no_aslr,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling {model_path} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return wrapper_paths(model_path)[1]


class HtpSession:
    """Runs an EPContext wrapper model (its context binary beside it) on the HTP backend."""

    def __init__(self, wrapper: Path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.add_provider_for_devices(_provider_devices(), _provider_options())
        self.session = ort.InferenceSession(str(wrapper), sess_options=so)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, feeds: dict) -> dict:
        outs = self.session.run(None, feeds)
        return dict(zip(self.output_names, outs))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "compile":
        sys.exit("usage: qnn_ctx.py compile <model.onnx>")
    # The emulator prints ' # LIBNATIVE' lines on stdout; the parent discards them.
    _compile_here(Path(sys.argv[2]).resolve())
