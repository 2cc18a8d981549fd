"""How stage 1 stores its fbank matrices in the ark shards: the model config's ``feats_storage``.

  float32  Kaldi's "FM" matrix: 4 bytes a value, the features exactly as computed (the default);
  uint16   Kaldi's 2-byte compressed matrix "CM2" (kaldiio's compression_method 3, kTwoByteAuto): the
           matrix's minimum and range, then each value as the nearest of 65536 evenly spaced levels
           between them. Half the bytes on the shared filesystem and in --local-cache, and still an ark
           that Kaldi and kaldiio read as it is. The error is half a level at most (0.501 of one:
           kaldiio rounds with + 0.499), about range / 131070, whatever the value. float16, the other 2-byte
           choice, keeps 11 significant bits of each value, so its error grows with the magnitude:
           1/128 for values from 16 to 32, more than uint16's for any matrix that reaches 16 and spans
           less than 1024 (bench/bench_feats_storage.py measures both on real fbank).

Reads and writes nothing itself. ``compression`` is what kaldiio's writer takes; ``stored`` is the matrix a
reader gets back (stage 1 takes the CMVN statistics from it: those of what training reads);
``decode_cm2`` is the decoding of data/feats_batch.py's reader, bit-identical to ``kaldiio.load_mat``.

  storage = check_storage(cfg.get("feats_storage", DEFAULT), "feats_storage")
  writer = kaldiio.WriteHelper("ark,scp:a.ark,a.scp", compression_method=compression(storage))
"""

from __future__ import annotations

import numpy as np
from kaldiio.compression_header import GlobalHeader, kTwoByteAuto

from funasr_recipe.core.rejections import BadInputError

DEFAULT = "float32"
# kaldiio's compression_method for each storage (None: an uncompressed "FM" matrix).
STORAGES: dict[str, int | None] = {"float32": None, "uint16": kTwoByteAuto}
# What each storage costs a value, and its Kaldi matrix header (b"\0B", the type token, then its fields).
BYTES_PER_VALUE = {"float32": 4, "uint16": 2}
HEADER_BYTES = {"float32": 15, "uint16": 22}  # "FM " rows cols (size-prefixed); "CM2 " min range rows cols
CM2_LEVELS = 65535.0  # kaldiio's GlobalHeader.c for "CM2": levels 0..65535 span [min, min + range]


def check_storage(value: object, where: str) -> str:
    """``value`` when it names a storage, else BadInputError naming ``where`` and the choices."""
    if not isinstance(value, str) or value not in STORAGES:
        raise BadInputError(f"{where}: {value!r} is not a feature storage; expected one of "
                            f"{', '.join(STORAGES)} (float32: exact; uint16: Kaldi's 2-byte compressed "
                            "matrix, half the bytes)")
    return value


def compression(storage: str) -> int | None:
    """kaldiio's ``compression_method`` that writes ``storage``."""
    return STORAGES[check_storage(storage, "feature storage")]


def matrix_bytes(storage: str, frames: int, dim: int) -> int:
    """Bytes of one (frames, dim) matrix in an ark, its header included (not its key)."""
    return HEADER_BYTES[storage] + frames * dim * BYTES_PER_VALUE[storage]


def decode_cm2(levels: np.ndarray, min_value: float, range_: float,
               out: np.ndarray | None = None) -> np.ndarray:
    """The float32 values of a "CM2" matrix's uint16 ``levels`` (into ``out`` when given): kaldiio's
    ``min + level * range / 65535`` in float32, in that order, so that the result is kaldiio's to the bit."""
    out = np.multiply(levels, np.float32(range_), out=out, dtype=np.float32)
    np.divide(out, np.float32(CM2_LEVELS), out=out)
    np.add(out, np.float32(min_value), out=out)
    return out


def stored(mat: np.ndarray, storage: str) -> np.ndarray:
    """The float32 matrix a reader gets back once ``mat`` is written with ``storage``."""
    method = compression(storage)
    if method is None:
        return mat
    header = GlobalHeader.compute(mat, method)
    # The file holds min and range as float32; a constant matrix's range is computed in float64.
    return decode_cm2(header.float_to_uint(mat), np.float32(header.min_value), np.float32(header.range))
