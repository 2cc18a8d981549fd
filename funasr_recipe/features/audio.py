"""Audio access for every stage: header probing now, decoding/resampling as later stages need it.

Audio is read with soundfile, never with ``torchaudio.load``: in torchaudio 2.9 that goes through
torchcodec/FFmpeg and is about 30x slower (docs/design.md, "Audio I/O and ONNX"). A wav.scp entry is
a path, or a Kaldi pipe ``cmd |`` whose standard output is an audio file; a pipe runs in its own
process group, which is killed whole when it runs over PIPE_TIMEOUT_S. Reads audio files and pipes' output;
writes nothing.
"""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
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


def is_pipe(source: str) -> bool:
    """True for a Kaldi pipe entry (``cmd args |``)."""
    return source.rstrip().endswith("|")


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
    return _read(_target(source), source)


def decode_audio_bytes(data: bytes, name: str = "upload") -> tuple[np.ndarray, int]:
    """Decode an audio file held in memory (an HTTP upload) as load_audio decodes a path, after the
    checks probe_audio makes, so that a cut-off upload is refused rather than transcribed in part.

    Raises AudioError: empty_file (0 bytes), unreadable_audio, truncated_audio, empty_audio.
    """
    if not data:
        raise AudioError("empty_file", f"{name}: 0 bytes")
    try:
        _probe(io.BytesIO(data), name)
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
    pipe_failed.
    """
    return _probe(_target(source), source)


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
