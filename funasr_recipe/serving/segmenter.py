"""Split long audio at pauses so that each piece fits the model, keeping every sample.

A plain energy detector rather than a neural VAD (silero-vad's package ships one): the service only
needs *where to cut*, a pause between words, not a speech/non-speech decision; no audio is dropped, so
a missed pause costs a cut in a word at worst (then at the quietest frame), never lost speech; and it
adds no second model to version, export and keep in step with the first. Reads and writes nothing.

  segments = split_at_pauses(wave, 16000, max_s=30.0)   # [(start_sample, end_sample), ...]
"""

from __future__ import annotations

import numpy as np

from funasr_recipe.core.rejections import BadInputError

FRAME_S = 0.01  # energy frames of 10 ms, the fbank's shift
MIN_PAUSE_S = 0.2  # shorter dips are inside words (stop consonants)
PAUSE_MARGIN_DB = 10.0  # a pause: within this of the recording's quiet level
SPEECH_GAP_DB = 15.0  # a pause is at least this far below the loud frames
MIN_SEGMENT_S = 1.0  # a cut never leaves a piece shorter than this before it


def frame_db(wave: np.ndarray, fs: int, frame_s: float = FRAME_S) -> np.ndarray:
    """Log energy (dB full scale) of each non-overlapping frame of mono ``wave``."""
    hop = max(1, int(round(frame_s * fs)))
    n = len(wave) // hop
    frames = wave[: n * hop].reshape(n, hop).astype(np.float64)
    return 10.0 * np.log10(np.mean(frames * frames, axis=1) + 1e-10)


def pause_centres(db: np.ndarray, min_frames: int, margin_db: float = PAUSE_MARGIN_DB) -> np.ndarray:
    """Frame index of the middle of each pause: a run of at least ``min_frames`` frames within
    ``margin_db`` of the quiet level (the 10th percentile of the frames' energy) and at least
    SPEECH_GAP_DB below the loud level (the 90th): audio with no such range (noise, music) has none."""
    low, high = np.percentile(db, [10, 90])
    quiet = db < min(low + margin_db, high - SPEECH_GAP_DB)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], quiet.astype(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]
    keep = ends - starts >= min_frames
    return (starts[keep] + ends[keep]) // 2


def split_at_pauses(wave: np.ndarray, fs: int, max_s: float = 30.0, min_pause_s: float = MIN_PAUSE_S,
                    min_segment_s: float = MIN_SEGMENT_S) -> list[tuple[int, int]]:
    """(start, end) sample ranges that cover ``wave`` end to end, none longer than ``max_s``: each cut
    at the last pause that keeps the piece under ``max_s``, else at the quietest frame of the piece's
    second half (speech with no pause for ``max_s``)."""
    if max_s <= 0:
        raise BadInputError(f"max_s must be positive, got {max_s}")
    limit = int(max_s * fs)
    if len(wave) <= limit:
        return [(0, len(wave))]
    hop = max(1, int(round(FRAME_S * fs)))
    db = frame_db(wave, fs)
    cuts = pause_centres(db, max(1, int(round(min_pause_s / FRAME_S)))) * hop
    ranges, start = [], 0
    while len(wave) - start > limit:
        lo, hi = start + int(min_segment_s * fs), start + limit
        inside = cuts[(cuts > lo) & (cuts <= hi)]
        if inside.size:
            cut = int(inside[-1])
        else:
            first, last = (start + limit // 2) // hop, hi // hop
            cut = (first + int(np.argmin(db[first:last]))) * hop if last > first else hi
        ranges.append((start, cut))
        start = cut
    ranges.append((start, len(wave)))
    return ranges
