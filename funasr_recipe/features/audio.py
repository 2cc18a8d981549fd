"""Audio access for every stage: header probing now, decoding/resampling as later stages need it.

Audio is read with soundfile, never with ``torchaudio.load``: in torchaudio 2.9 that goes through
torchcodec/FFmpeg and is about 30x slower (docs/design.md, "Audio I/O and ONNX"). A wav.scp entry is
a path, or a Kaldi pipe ``cmd |`` whose standard output is an audio file; a pipe runs in its own
process group, which is killed whole when it runs over PIPE_TIMEOUT_S. Either may end in a time range
``#t=<start>,<end>`` or ``#t=<start>`` (to the end; seconds, the W3C media-fragment syntax): an
utterance of a Kaldi ``segments`` file or a lhotse supervision, of which only that range is decoded.
Reads audio files and pipes' output; writes nothing.

  wave, rate = load_audio(with_range("/data/rec.flac", 12.5, 15.25))
"""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from funasr_recipe.core.rejections import BadInputError

# Reading the last samples catches a compressed file (FLAC) cut short: its header still promises
# the full length, and only decoding the tail fails.
_TAIL_SECONDS = 0.1
# libsndfile clamps a truncated WAV's length to the bytes present and notes the mismatch as
# "data : 32000 (should be 15978)" in its chunk log; that note is the only trace of the cut.
_WAV_SHORT_DATA = re.compile(r"^data\s*:\s*\d+\s*\(should be \d+\)", re.MULTILINE)
_BUFFER = re.compile(r"<_io\.BytesIO object at 0x[0-9a-f]+>")
# A pipe that fetches from slow storage may need longer; the fault suite needs much shorter.
PIPE_TIMEOUT_S = float(os.environ.get("RECIPE_PIPE_TIMEOUT_S", 120))


class AudioError(BadInputError):
    """An audio entry that cannot be used; ``reason`` is a stable identifier for reports."""

    def __init__(self, reason: str, detail: str) -> None:
        # Both in args: the error crosses process boundaries (stage 0's probing pool) by pickling.
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class AudioInfo:
    """What the header says about one audio entry."""

    sample_rate: int
    channels: int
    frames: int
    subtype: str  # e.g. PCM_16, PCM_24, FLOAT

    @property
    def duration(self) -> float:
        return self.frames / self.sample_rate


# A segment's end may pass its recording's by this much, rounding of times written with 2-3 decimals
# (a frame at 8 kHz is 0.125 ms); the segment is then read to the recording's end.
RANGE_SLACK_S = 0.01
_RANGE = re.compile(r"^(?P<base>.+)#t=(?P<start>\d+(?:\.\d*)?)(?:,(?P<end>\d+(?:\.\d*)?))?$", re.DOTALL)


def with_range(source: str, start: float, end: float | None) -> str:
    """``source`` limited to [start, end) seconds (end None: to its end): ``/a/rec.wav#t=1.5,3.25``.
    Times keep up to 6 decimals (repr would give 0.30000000000000004)."""
    def sec(t: float) -> str:
        return f"{t:.6f}".rstrip("0").rstrip(".")

    return f"{source}#t={sec(start)}" + ("" if end is None else f",{sec(end)}")


def split_range(source: str) -> tuple[str, float | None, float | None]:
    """(base entry, start, end) of an entry: (entry, None, None) without a time range, end None for
    one that runs to the end of its recording."""
    m = _RANGE.match(source)
    if m is None:
        return source, None, None
    end = m.group("end")
    return m.group("base"), float(m.group("start")), None if end is None else float(end)


def is_pipe(source: str) -> bool:
    """True for a Kaldi pipe entry (``cmd args |``), with or without a time range."""
    return split_range(source)[0].rstrip().endswith("|")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill every process of the pipe's group and reap its shell. Killing only the shell (what
    ``subprocess.run`` does on a timeout) leaves its children running, and one that holds the pipe's
    stdout makes the read wait for it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is gone already
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def run_pipe(source: str) -> bytes:
    """Run a Kaldi pipe entry and return its standard output; raises AudioError(pipe_failed).

    The command gets its own session (so its own process group): on a timeout or any error the whole
    group is killed, not just the shell.
    """
    cmd = source.rstrip()[:-1]
    try:
        proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as e:
        raise AudioError("pipe_failed", f"'{cmd}' could not start: {e}") from e
    try:
        out, err_b = proc.communicate(timeout=PIPE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        _kill_group(proc)
        raise AudioError("pipe_failed", f"'{cmd}' ran over {PIPE_TIMEOUT_S:g}s (its processes were killed; "
                         "RECIPE_PIPE_TIMEOUT_S sets the limit)") from e
    except Exception as e:
        _kill_group(proc)
        raise AudioError("pipe_failed", f"'{cmd}': {type(e).__name__}: {e}") from e
    except BaseException:  # an interrupt stays an interrupt, without leaving the pipe running
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        err = err_b.decode("utf-8", "replace").strip().splitlines()  # stderr, not data: \r ends lines too
        raise AudioError("pipe_failed", f"'{cmd}' exited {proc.returncode}: {err[-1] if err else ''}")
    return out


def _denied(source: str) -> AudioError | None:
    """permission_denied when the user may not read ``source``. Called once libsndfile has failed:
    it reports a denied read only as "System error.", which would send the user looking at the audio."""
    try:
        with open(source, "rb"):
            return None
    except PermissionError:
        return AudioError("permission_denied", f"permission denied: {source}")
    except OSError:
        return None


def _target(source: str) -> str | io.BytesIO:
    """What soundfile should open for an entry: the path, or a pipe's output in memory."""
    if is_pipe(source):
        data = run_pipe(source)
        if not data:
            raise AudioError("pipe_failed", f"'{source}' wrote no output")
        return io.BytesIO(data)
    try:
        st = os.stat(source)
    except PermissionError:  # a directory on the way that this user may not enter: the file may exist
        raise AudioError("permission_denied", f"permission denied: {source}") from None
    except (FileNotFoundError, NotADirectoryError):
        raise AudioError("missing_file", f"no such file: {source}") from None
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, a dangling loop of links
        raise AudioError("missing_file", f"no such file: {source} ({e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise AudioError("unreadable_audio", f"not a regular file: {source}")
    return source


def load_audio(source: str) -> tuple[np.ndarray, int]:
    """Decode a whole entry as float32 (frames, channels) in [-1, 1] with soundfile; raises AudioError.

    soundfile rather than ``torchaudio.load``: in torchaudio 2.9 the latter decodes through torchcodec
    and FFmpeg, about 30x slower for WAV/FLAC and a dependency we do not want.
    """
    base, start, end = split_range(source)
    if start is None:
        return _read(_target(source), source)
    target, (first, last), _ = _open_range(base, start, end, source)
    if isinstance(target, io.BytesIO):  # a pipe's output: decoded whole, then cut
        data, rate = _read(target, source)
        return data[first:last], rate
    try:
        return sf.read(target, start=first, stop=last, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError, OSError) as e:
        raise AudioError("unreadable_audio", f"{source}: {e}") from e


def _open_range(base: str, start: float, end: float | None,
                source: str) -> tuple[str | io.BytesIO, tuple[int, int], AudioInfo]:
    """What to read for a range of base, its [first, last) frames and the recording's header, checked as
    probe_audio checks a whole entry; raises AudioError (also bad_segment: an empty or reversed range;
    segment_past_end: one that ends after its recording)."""
    target = _target(base)
    info = _probe(target, base)
    if isinstance(target, io.BytesIO):
        target.seek(0)
    end = info.duration if end is None else end
    if end <= start:
        raise AudioError("bad_segment", f"{source}: the range ends at {end:g}s, not after its start "
                         f"{start:g}s")
    if end > info.duration + RANGE_SLACK_S or round(start * info.sample_rate) >= info.frames:
        raise AudioError("segment_past_end", f"{source}: the range {start:g}-{end:g}s passes the end of its "
                         f"recording {base} ({info.duration:.3f}s)")
    first, last = round(start * info.sample_rate), min(info.frames, round(end * info.sample_rate))
    return target, (first, last), info


def decode_audio_bytes(data: bytes, name: str = "upload",
                       check: Callable[[AudioInfo], None] | None = None) -> tuple[np.ndarray, int]:
    """Decode an audio file held in memory (an HTTP upload) as load_audio decodes a path, after the
    checks probe_audio makes, so that a cut-off upload is refused rather than transcribed in part.
    ``check`` judges the header before anything is decoded (a duration or rate limit: a small FLAC
    of an hour of silence decodes to gigabytes) and raises AudioError to refuse.

    Raises AudioError: empty_file (0 bytes), unreadable_audio, truncated_audio, empty_audio.
    """
    if not data:
        raise AudioError("empty_file", f"{name}: 0 bytes")
    try:
        info = _probe(io.BytesIO(data), name)
        if check is not None:
            check(info)
        return _read(io.BytesIO(data), name)
    except AudioError as e:  # libsndfile names the buffer "<_io.BytesIO object at 0x...>": name the upload
        raise AudioError(e.reason, _BUFFER.sub(name, e.detail)) from None


def _read(target: str | io.BytesIO, source: str) -> tuple[np.ndarray, int]:
    try:
        data, rate = sf.read(target, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, ValueError, OSError) as e:
        if isinstance(target, str) and (denied := _denied(target)):
            raise denied from e
        raise AudioError("unreadable_audio", f"{source}: {e}") from e
    if data.shape[0] == 0:
        raise AudioError("empty_audio", f"0 samples: {source}")
    return data, rate


def probe_audio(source: str) -> AudioInfo:
    """Read an entry's header (and its last 0.1 s, to catch truncation); raises AudioError.

    Reasons: missing_file, permission_denied, unreadable_audio, truncated_audio, empty_audio,
    pipe_failed; for a time range also bad_segment and segment_past_end. A range's info is the
    range's: its frames, with the recording's rate, channels and sample format.
    """
    base, start, end = split_range(source)
    if start is None:
        return _probe(_target(source), source)
    _, (first, last), info = _open_range(base, start, end, source)
    return AudioInfo(info.sample_rate, info.channels, last - first, info.subtype)


def _probe(target: str | io.BytesIO, source: str) -> AudioInfo:
    try:
        f = sf.SoundFile(target)
    except (sf.LibsndfileError, RuntimeError, ValueError, OSError) as e:
        if isinstance(target, str) and (denied := _denied(target)):
            raise denied from e
        # An unknown format, a mangled header, no audio at all.
        raise AudioError("unreadable_audio", f"{source}: {e}") from e
    with f:
        info = AudioInfo(f.samplerate, f.channels, f.frames, f.subtype)
        if info.frames == 0:
            raise AudioError("empty_audio", f"0 samples: {source}")
        short = _WAV_SHORT_DATA.search(f.extra_info) if f.format == "WAV" else None
        if short:
            raise AudioError("truncated_audio",
                             f"{source}: header says more than the file holds ({short.group(0)})")
        tail = min(info.frames, max(1, int(_TAIL_SECONDS * info.sample_rate)))
        try:
            f.seek(info.frames - tail)
            got = len(f.read(tail, dtype="int16", always_2d=True))
        except (sf.LibsndfileError, RuntimeError, ValueError) as e:
            raise AudioError("truncated_audio", f"{source}: decoding the last samples failed: {e}") from e
        if got < tail:
            raise AudioError("truncated_audio",
                             f"{source}: header says {info.frames} samples, the data ends early")
    return info
