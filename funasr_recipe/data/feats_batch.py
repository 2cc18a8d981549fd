"""Whole training batches of stage-1 features in one pass: read, LFR, CMVN and padding into one buffer.

Reads Kaldi ark matrices at ``<ark>:<offset>`` (stage 1 writes float32 ``FM`` matrices, or 2-byte ``CM2``
ones with ``feats_storage: uint16``: each read here with one ``pread``, a ``CM2`` decoded into a float32
buffer as kaldiio decodes it; any other kind goes through kaldiio); writes nothing to disk.

Why: funasr's collator gets one tensor per utterance and pads them (a second copy of every frame),
and a batch built in a DataLoader worker crosses to the training process as four tensors, each
handed over through its own file-descriptor handshake. Here the LFR frames are copied from the read
buffer straight into their row of the padded batch with CMVN's addition in the same pass (then its
multiplication while the rows are still in cache), into one of data/shm_pool.py's recycled shared
buffers, so that pickling a worker's batch copies nothing and maps nothing new; the small tensors
(lengths, token ids) travel inside the pickle itself. The values are
bit-identical to ``features.cmvn.lfr`` + funasr's ``apply_cmvn`` + funasr's collator
(tests/unit/data/test_feats_batch.py): LFR only copies, and CMVN is the same float32 add then multiply.

  reader = ArkReader()
  speech, lengths = speech_batch(reader, sources, frames, frontend, pad_value=0.0)
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import kaldiio
import numpy as np
import torch

from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.shm_pool import SlotPool, rebuild
from funasr_recipe.features.cmvn import lfr
from funasr_recipe.features.storage import HEADER_BYTES, decode_cm2

# b"\0B", b"FM ", then the rows and the columns, each an int32 after its size byte 4.
HEADER = 15
_HEADER_DTYPE = np.dtype([("binary", "S2"), ("kind", "S3"), ("s1", "u1"), ("rows", "<i4"), ("s2", "u1"),
                          ("cols", "<i4")])
_ALIGN = 16  # the header is read one byte into the buffer, so that the floats start 16-byte aligned
# A "CM2" matrix (features/storage.py): b"\0B", b"CM2 ", then its float32 min and range, rows and columns.
_CM2_DTYPE = np.dtype([("binary", "S2"), ("kind", "S3"), ("space", "u1"), ("min", "<f4"), ("range", "<f4"),
                       ("rows", "<i4"), ("cols", "<i4")])


class ArkReader:
    """Reads feature matrices of ark files, keeping up to ``max_open`` of them open (least recently used
    closed first). One reader per process: the returned array is a view of a buffer that the next
    ``read`` overwrites. Inherited across fork it stays valid, as pread shares no file position."""

    def __init__(self, max_open: int = 64) -> None:
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._buf = np.empty(0, dtype=np.uint8)
        self._decoded = np.empty(0, dtype=np.float32)  # a CM2 matrix's values, overwritten by the next

    def read(self, source: str, frames: int, dim: int) -> np.ndarray:
        """(frames, dim) float32 matrix at ``source``; ``frames`` is a hint (one read when right).
        RuntimeError naming the source when it cannot be read."""
        try:
            path, offset = source.rsplit(":", 1)
            fd = self._fd(path)
            mat = self._pread(fd, int(offset), frames, dim)
            if mat is None:  # neither FM nor CM2 (what stage 1 writes): kaldiio knows every other kind
                mat = np.ascontiguousarray(kaldiio.load_mat(source))
        except Exception as e:  # kaldiio raises bare Exceptions, OSError, ValueError...
            raise RuntimeError(f"cannot read features {source}: {e}; rerun stage 1") from e
        return mat

    def _pread(self, fd: int, offset: int, frames: int, dim: int) -> np.ndarray | None:
        want = HEADER + max(frames, 0) * dim * 4
        got = self._read_into(fd, offset, want)
        if got < HEADER:
            raise BadInputError(f"ark ends {got} bytes after the offset, inside the matrix header")
        head = np.frombuffer(self._buf, dtype=_HEADER_DTYPE, count=1, offset=1)[0]
        if head["binary"] != b"\0B":
            return None
        if head["kind"] == b"FM ":
            rows, cols = int(head["rows"]), int(head["cols"])
            self._read_whole(fd, offset, got, HEADER + rows * cols * 4, f"{rows}x{cols} matrix")
            data = np.frombuffer(self._buf, dtype=np.float32, count=rows * cols, offset=_ALIGN)
            return data.reshape(rows, cols)
        if head["kind"] != b"CM2" or head["s1"] != ord(" "):
            return None
        size = HEADER_BYTES["uint16"]
        got = self._read_whole(fd, offset, got, size, "CM2 matrix header")  # longer than an FM one
        cm2 = np.frombuffer(self._buf, dtype=_CM2_DTYPE, count=1, offset=1)[0]
        rows, cols = int(cm2["rows"]), int(cm2["cols"])
        self._read_whole(fd, offset, got, size + rows * cols * 2, f"{rows}x{cols} CM2 matrix")
        if self._decoded.size < rows * cols:
            self._decoded = np.empty(max(rows * cols, 2 * self._decoded.size), dtype=np.float32)
        levels = np.frombuffer(self._buf, dtype="<u2", count=rows * cols, offset=1 + size)
        out = self._decoded[: rows * cols]
        return decode_cm2(levels, cm2["min"], cm2["range"], out=out).reshape(rows, cols)

    def _read_whole(self, fd: int, offset: int, got: int, need: int, what: str) -> int:
        """Bytes in the buffer once it holds ``need`` from ``offset`` (read again if the hint was short)."""
        if need > got:  # the hint was short (or wrong): read the whole matrix now that its size is known
            got = self._read_into(fd, offset, need)
            if got < need:
                raise BadInputError(f"ark ends inside a {what} ({got} of {need} bytes)")
        return got

    def _read_into(self, fd: int, offset: int, size: int) -> int:
        if self._buf.size < size + 1:
            self._buf = np.empty(max(size + 1, 2 * self._buf.size), dtype=np.uint8)
        return os.preadv(fd, [memoryview(self._buf)[1 : size + 1]], offset)

    def _fd(self, path: str) -> int:
        fd = self._fds.pop(path, None)
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            if len(self._fds) >= self.max_open:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[path] = fd
        return fd

    def __getstate__(self) -> dict:
        # A spawned worker gets a pickled copy: file descriptors mean nothing in another process.
        return {"max_open": self.max_open}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, TypeError):  # at interpreter exit ``os`` may be gone: the fds close anyway
            pass


def read_features(reader: ArkReader, source: str, frames: int, n_mels: int) -> np.ndarray:
    """``reader.read``, checked against the frontend's mel bins (ValueError naming the source)."""
    mat = reader.read(source, frames, n_mels)
    if mat.ndim != 2 or mat.shape[1] != n_mels:
        raise BadInputError(f"features {source} have shape {mat.shape}, the frontend expects {n_mels} mel "
                            "bins: rerun stage 1 with this config")
    return mat


def lfr_frames(frames: int, lfr_n: int) -> int:
    """Frames after low-frame-rate stacking, as funasr's ``apply_lfr`` counts them."""
    return -(-frames // lfr_n)


def lfr_into(mat: np.ndarray, lfr_m: int, lfr_n: int, out: np.ndarray,
             shift: np.ndarray | None = None) -> None:
    """``features.cmvn.lfr(mat, lfr_m, lfr_n)`` written into ``out`` (lfr_frames rows, lfr_m x dim), plus
    ``shift`` (lfr_m x dim) when given: the copy and CMVN's addition in one pass over the rows.

    Stacked frame t is the lfr_m consecutive input rows from t*n - (m-1)//2, a contiguous run of the
    row-major matrix: every frame whose run lies inside the matrix is one strided view of it, and only
    the few at the ends, which repeat the first or last row, go through an index as ``lfr`` does.
    """
    frames, dim = mat.shape
    rows = out.shape[0]
    if lfr_m == 1 and lfr_n == 1:
        _put(mat, out, shift)
        return
    left = (lfr_m - 1) // 2
    first = -(-left // lfr_n)  # first stacked frame that starts at or after input row 0
    last = (frames - lfr_m + left) // lfr_n + 1 if frames >= lfr_m - left else first
    last = min(max(last, first), rows)
    if last > first:
        # The ndarray constructor checks that the view stays inside ``mat``; as_strided would not.
        inner = np.ndarray((last - first, lfr_m * dim), dtype=mat.dtype, buffer=mat,
                           offset=(first * lfr_n - left) * dim * mat.itemsize,
                           strides=(lfr_n * dim * mat.itemsize, mat.itemsize))
        _put(inner, out[first:last], shift)
    for t in chain(range(min(first, rows)), range(last, rows)):  # a handful: plain Python is quicker
        start = t * lfr_n - left
        _put(mat[[min(max(start + j, 0), frames - 1) for j in range(lfr_m)]].reshape(-1), out[t], shift)


def _put(src: np.ndarray, dst: np.ndarray, shift: np.ndarray | None) -> None:
    if shift is None:
        dst[...] = src
    else:
        np.add(src, shift, out=dst)


Alloc = Callable[[Sequence[int], torch.dtype], torch.Tensor]


def new_tensor(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor, in shared memory when built in a DataLoader worker, as torch's own
    ``default_collate`` allocates its batches: the worker's pickling then moves nothing."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=dtype).set_(storage).view(tuple(shape))


def speech_batch(reader: ArkReader, sources: Sequence[str], frames: Sequence[int], frontend: Any,
                 pad_value: float, alloc: Alloc = new_tensor,
                 discard: Callable[[torch.Tensor], None] | None = None) -> tuple[torch.Tensor, list[int]]:
    """(batch, longest, lfr_m x n_mels) padded model input of the utterances, and each one's length.

    ``frontend`` is the model's WavFrontend (its n_mels, lfr_m, lfr_n, cmvn); ``frames`` are the
    jsonl's ``source_len``, which size the batch before anything is read. Should one of them be wrong,
    the batch is built again from copies of the matrices, sized by the matrices themselves. ``alloc``
    gives the uninitialised batch tensor (data/shm_pool.py's recycled buffers, or ``new_tensor``), and
    ``discard`` takes back one that will never be handed out (``SlotPool.give_back``).
    """

    def read(i: int) -> np.ndarray:
        return read_features(reader, sources[i], int(frames[i]), frontend.n_mels)

    # Shards are read in ark order (by path, then offset): each file front to back.
    order = sorted(range(len(sources)), key=lambda i: _ark_position(sources[i]))
    try:
        return _assemble(order, [int(f) for f in frames], read, frontend, pad_value, alloc, discard)
    except _WrongLength:
        mats = {i: read(i).copy() for i in order}  # each read reuses the reader's buffer
        return _assemble(order, [mats[i].shape[0] for i in range(len(sources))], mats.__getitem__,
                         frontend, pad_value, alloc, discard)


class _WrongLength(Exception):
    pass


def _ark_position(source: str) -> tuple[str, int]:
    path, _, offset = source.rpartition(":")
    return path, int(offset) if offset.isdigit() else 0


def _assemble(order: list[int], frames: list[int], matrix: Any, frontend: Any, pad_value: float,
              alloc: Alloc, discard: Callable[[torch.Tensor], None] | None) -> tuple[torch.Tensor, list[int]]:
    lengths = [lfr_frames(f, frontend.lfr_n) for f in frames]
    speech = alloc((len(frames), max(lengths, default=0), frontend.lfr_m * frontend.n_mels), torch.float32)
    try:
        _fill(speech.numpy(), order, frames, lengths, matrix, frontend, pad_value)
    except BaseException:
        if discard is not None:  # a worker's buffer that never reaches the trainer must not stay taken
            discard(speech)
        raise
    return speech, lengths


def _fill(out: np.ndarray, order: list[int], frames: list[int], lengths: list[int], matrix: Any,
          frontend: Any, pad_value: float) -> None:
    m, n = frontend.lfr_m, frontend.lfr_n
    cmvn = None if frontend.cmvn is None else frontend.cmvn.numpy()
    for i in order:
        mat, rows = matrix(i), out[i, : lengths[i]]
        if mat.shape[0] != frames[i]:
            raise _WrongLength
        if mat.dtype == np.float32:  # funasr's apply_cmvn: add, then multiply, in float32
            lfr_into(mat, m, n, rows, None if cmvn is None else cmvn[0])
            if cmvn is not None:
                np.multiply(rows, cmvn[1], out=rows)
        else:  # kaldiio's float64 matrices: funasr computes those in float64 before its float32 cast
            rows[:] = model_input(mat, frontend).numpy()
        out[i, lengths[i] :] = pad_value


def model_input(mat: np.ndarray, frontend: Any) -> torch.Tensor:
    """(frames', dim') model input of one fbank matrix, one utterance at a time: ``features.cmvn.lfr``,
    then funasr's ``apply_cmvn`` (the reference that ``speech_batch`` reproduces bit for bit)."""
    from funasr.frontends.wav_frontend import apply_cmvn

    # lfr() gathers into a new array (a copy even for m = n = 1): apply_cmvn works in place, and
    # kaldiio may hand out a read-only array.
    stacked = lfr(mat, frontend.lfr_m, frontend.lfr_n)
    feats = torch.from_numpy(stacked if stacked is not mat else mat.copy())
    if frontend.cmvn is not None:
        feats = apply_cmvn(feats, frontend.cmvn)
    return feats


def pad_ids(ids: Sequence[Sequence[int]], pad_value: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, longest) int64 token ids padded with ``pad_value``, and (batch, 1) int32 lengths: what
    funasr's collator makes of the per-utterance ``text`` and ``text_lengths``."""
    lengths = np.array([[len(seq)] for seq in ids], dtype=np.int32).reshape(len(ids), 1)
    text = np.full((len(ids), int(lengths.max(initial=0))), pad_value, dtype=np.int64)
    for row, seq in enumerate(ids):
        text[row, : len(seq)] = seq
    return torch.from_numpy(text), torch.from_numpy(lengths)


class WorkerBatch(dict):
    """A collated batch built in a worker, pickled for the training process: a tensor in one of
    ``pool``'s buffers as its place there, the small ones (lengths, token ids) inline, any other as torch
    pickles it (one file-descriptor handshake each). It arrives as a plain dict.
    """

    def __init__(self, batch: dict[str, Any], pool: SlotPool | None = None) -> None:
        super().__init__(batch)
        self.pool = pool

    def __reduce__(self) -> tuple:
        items = []
        for key, value in self.items():
            pooled = self.pool.reduce(value) if self.pool is not None and _cpu_tensor(value) else None
            if pooled is not None:
                items.append((key, "pool", pooled))
            elif _cpu_tensor(value) and value.nbytes <= 1 << 16:
                items.append((key, "numpy", value.numpy()))
            else:
                items.append((key, "object", value))
        return _unpickle_batch, (items,)


def _cpu_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _unpickle_batch(items: list[tuple[str, str, Any]]) -> dict[str, Any]:
    how = {"pool": rebuild, "numpy": torch.from_numpy, "object": lambda v: v}
    return {key: how[kind](value) for key, kind, value in items}


def batch_pool(frontend: Any, conf: dict[str, Any]) -> SlotPool | None:
    """Recycled shared buffers (data/shm_pool.py) for the batches of a dataset built with ``conf`` (its
    dataset_conf): a region per DataLoader worker (``num_workers``, funasr's default 4) and one for the
    training process, ``prefetch_factor`` + 2 slots each, a slot holding the largest token batch. None
    with ``reuse_batch_memory: false``, for example-counted batches (no size bound), or another frontend.
    """
    if not conf.get("reuse_batch_memory", True) or conf.get("batch_type") != "token" or not all(
            isinstance(getattr(frontend, k, None), int) for k in ("lfr_m", "lfr_n", "n_mels")):
        return None
    # Padded frames <= batch_size, so stacked rows <= batch_size / lfr_n plus one per utterance.
    rows = int(conf["batch_size"]) // frontend.lfr_n + int(conf.get("batch_size_sample_max", 200))
    return SlotPool.create(regions=int(conf.get("num_workers", 4)) + 1,
                           slots=int(conf.get("prefetch_factor") or 2) + 2,
                           slot_bytes=rows * frontend.lfr_m * frontend.n_mels * 4)
