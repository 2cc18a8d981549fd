"""Global CMVN statistics of low-frame-rate features, written as funasr's ``am.mvn``.

funasr's ``WavFrontend`` applies LFR (stacking ``lfr_m`` frames every ``lfr_n``) and THEN CMVN, so
the statistics are taken over LFR frames (560-dim for SenseVoice/Paraformer), with edge padding
exactly as funasr's ``apply_lfr`` pads (tests/unit/features/test_fbank.py compares the two on every length).

Reads fbank matrices; writes ``<shard>.stats.npz`` partial sums and the merged ``am.mvn`` (Kaldi
nnet1 text: ``<AddShift>`` holds -mean, ``<Rescale>`` holds 1/std, as ``load_cmvn`` parses them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from funasr_recipe.core.rejections import BadInputError

if TYPE_CHECKING:
    from funasr_recipe.features.fbank_conf import FbankConf

VAR_FLOOR = 1e-8  # a constant dimension (e.g. a dead mel bin in digital silence) must not divide by 0


def lfr_index(frames: int, lfr_m: int, lfr_n: int) -> np.ndarray:
    """(ceil(frames / n), m) input frame of each stacked slot, as funasr's ``apply_lfr`` pads.

    Output frame t stacks input frames t*n - (m-1)//2 ... t*n + m-1 - (m-1)//2, the first and last
    frame repeated where that runs off the ends.
    """
    starts = np.arange(-(-frames // lfr_n)) * lfr_n - (lfr_m - 1) // 2
    return np.clip(starts[:, None] + np.arange(lfr_m)[None, :], 0, frames - 1)


def lfr(mat: np.ndarray, lfr_m: int, lfr_n: int) -> np.ndarray:
    """funasr's low-frame-rate stacking of (frames, dim) fbank; identity for m = n = 1.

    In numpy rather than a call to funasr's ``apply_lfr`` because importing funasr costs every
    stage-1 process about 5 s, longer than the features of a small corpus take.
    """
    if lfr_m == 1 and lfr_n == 1:
        return mat
    index = lfr_index(mat.shape[0], lfr_m, lfr_n)
    return mat[index].reshape(index.shape[0], lfr_m * mat.shape[1])


class CmvnStats:
    """Running sums of LFR frames in float64 (float32 sums drift on hundreds of hours)."""

    def __init__(self, dim: int = 0) -> None:
        self.count = 0
        self.sum = np.zeros(dim)
        self.sumsq = np.zeros(dim)

    def add(self, feats: np.ndarray) -> None:
        """Count every frame of (frames, dim) features."""
        self._accumulate(feats.shape[0], feats.sum(axis=0, dtype=np.float64),
                         np.square(feats, dtype=np.float64).sum(axis=0))

    def add_lfr(self, fbank: np.ndarray, lfr_m: int, lfr_n: int) -> None:
        """Count the LFR frames of (frames, dim) fbank without building them.

        Slot j of the stacked frames holds input frame index[t, j]; its sum over t is the input frames
        weighted by how often each appears there: one (m, frames) @ (frames, dim) product instead of
        materialising (frames / n, m * dim) and summing it, about 3x less time per utterance.
        """
        index = lfr_index(fbank.shape[0], lfr_m, lfr_n)
        weights = np.zeros((lfr_m, fbank.shape[0]))
        for j in range(lfr_m):
            weights[j] = np.bincount(index[:, j], minlength=fbank.shape[0])
        x = fbank.astype(np.float64)
        self._accumulate(index.shape[0], (weights @ x).reshape(-1), (weights @ np.square(x)).reshape(-1))

    def _accumulate(self, count: int, total: np.ndarray, total_sq: np.ndarray) -> None:
        if not self.sum.size:
            self.sum, self.sumsq = np.zeros_like(total), np.zeros_like(total_sq)
        self.count += count
        self.sum += total
        self.sumsq += total_sq

    def merge(self, other: CmvnStats) -> None:
        if not other.count:
            return
        if not self.count:
            self.sum, self.sumsq = np.zeros_like(other.sum), np.zeros_like(other.sumsq)
        if self.sum.shape != other.sum.shape:
            raise ValueError(f"CMVN stats of dim {other.sum.shape[0]} cannot merge into {self.sum.shape[0]}")
        self.count += other.count
        self.sum += other.sum
        self.sumsq += other.sumsq

    def save(self, path: Path) -> None:
        np.savez(path, count=self.count, sum=self.sum, sumsq=self.sumsq)

    @classmethod
    def load(cls, path: Path) -> CmvnStats:
        with np.load(path) as z:
            stats = cls()
            stats.count, stats.sum, stats.sumsq = int(z["count"]), z["sum"], z["sumsq"]
        return stats

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.count:
            raise BadInputError("no frames: cannot compute CMVN")
        mean = self.sum / self.count
        var = np.maximum(self.sumsq / self.count - np.square(mean), VAR_FLOOR)
        return mean, np.sqrt(var)


def write_am_mvn(path: Path, mean: np.ndarray, std: np.ndarray) -> None:
    """Write CMVN in the Kaldi nnet1 text form that funasr (and funasr-onnx) read as ``am.mvn``."""
    dim = mean.shape[0]

    def vec(v: np.ndarray) -> str:
        return " ".join(f"{x:.8g}" for x in v)

    text = (f"<Nnet>\n<Splice> {dim} {dim}\n[ 0 ]\n"
            f"<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {vec(-mean)} ]\n"
            f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {vec(1.0 / std)} ]\n</Nnet>\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def read_am_mvn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) float32 of an ``am.mvn``, as funasr's ``load_cmvn`` parses it: the features the
    model saw are ``(lfr + shift) * scale``, in float32 like funasr's frontend. BadInputError naming the
    file, the line and what is wrong for a malformed or truncated one (funasr's own reader then fails in
    numpy, "inhomogeneous shape", naming no file)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not an am.mvn (not text: {e.reason} at byte {e.start})") from e
    found: dict[str, np.ndarray] = {}
    for i, line in enumerate(lines):
        head = line.split()
        if head[:1] not in (["<AddShift>"], ["<Rescale>"]):
            continue
        name, where = head[0], f"{path}:{i + 2}"
        values = lines[i + 1].split() if i + 1 < len(lines) else []
        if values[:1] != ["<LearnRateCoef>"] or values[2:3] != ["["]:
            raise BadInputError(f"{where}: {name} is not followed by '<LearnRateCoef> 0 [ values ]' "
                                f"({'the file ends' if i + 1 == len(lines) else 'truncated or malformed'})")
        if values[-1] != "]":
            raise BadInputError(f"{where}: {name}'s values do not end with ']' (a truncated file?)")
        try:
            found[name] = np.array(values[3:-1], dtype=np.float32)
        except ValueError as e:
            raise BadInputError(f"{where}: {name}: a value is not a number ({e})") from e
        if len(head) > 1 and head[1].isdigit() and int(head[1]) != found[name].shape[0]:
            raise BadInputError(f"{where}: {name} has {found[name].shape[0]} values, its header {head[1]}")
        if not np.isfinite(found[name]).all():
            raise BadInputError(f"{where}: {name} holds non-finite values (nan or inf)")
    if len(found) < 2:
        missing = " and ".join(n for n in ("<AddShift>", "<Rescale>") if n not in found)
        raise BadInputError(f"{path}: not an am.mvn: no {missing} section")
    shift, scale = found["<AddShift>"], found["<Rescale>"]
    if shift.shape != scale.shape:
        raise BadInputError(f"{path}: <AddShift> has {shift.shape[0]} values and <Rescale> {scale.shape[0]}: "
                            "not one dimension (a truncated or mixed file?)")
    return shift, scale


def cmvn_name(conf: FbankConf) -> str:
    """The am.mvn of one LFR setting (stage 1 writes one per setting): its dimension and statistics depend
    on lfr_m and lfr_n."""
    return f"am.lfr{conf.lfr_m}x{conf.lfr_n}.mvn"
