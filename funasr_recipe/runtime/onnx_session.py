"""onnxruntime pieces of the recipe's ONNX runtime (runtime/onnx_asr.py): the session, greedy CTC.

Needs neither torch nor funasr: a deployment can run the graph and decode it with onnxruntime and numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort


def make_session(path: Path, threads: int, device: str = "cpu", spin: bool = True) -> ort.InferenceSession:
    """An onnxruntime session: ``threads`` intra-op threads (onnxruntime's default is one per core it
    sees, funasr-onnx's is 4 whatever the machine: both oversubscribe a process given fewer cores).
    ``spin=False``: idle threads sleep at once instead of spinning, for a caller that has work of its
    own running beside onnxruntime (spinning is a little faster when onnxruntime runs alone)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 4  # errors reach the caller as exceptions; no second copy on stderr
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("device cuda: this onnxruntime has no CUDAExecutionProvider "
                               "(install onnxruntime-gpu of the same version)")
        index = device.partition(":")[2] or "0"
        providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers)


def collapse_ctc(best: np.ndarray, blank_id: int = 0) -> list[int]:
    """Greedy CTC of one utterance's best token per frame: repeats collapsed, blanks dropped."""
    if best.size == 0:
        return []
    keep = np.concatenate(([True], best[1:] != best[:-1])) & (best != blank_id)
    return best[keep].tolist()


def greedy_ctc(log_probs: np.ndarray, blank_id: int = 0) -> list[int]:
    """Best path of one utterance's (frames, vocab) scores: argmax, repeats collapsed, blanks dropped."""
    return collapse_ctc(log_probs.argmax(axis=-1), blank_id)


def ctc_spans(best: np.ndarray, blank_id: int = 0) -> list[tuple[int, int, int]]:
    """Greedy CTC with positions: (token, first frame, end frame) of each emitted token, where the
    frames [first, end) are the run of that token's best path (its repeats), blanks dropped."""
    if best.size == 0:
        return []
    starts = np.flatnonzero(np.concatenate(([True], best[1:] != best[:-1])))
    ends = np.append(starts[1:], best.size)
    return [(int(best[s]), int(s), int(e)) for s, e in zip(starts, ends, strict=True) if best[s] != blank_id]
