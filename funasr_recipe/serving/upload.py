"""An upload's bytes -> audio the service may decode, with every limit applied before the work it
guards: the rate and duration from the header before decoding (a 673 KB FLAC of an hour of 48 kHz
silence decodes to 1.35 GB), a container without a usable header decoded in bounded pieces, and the
samples checked to be finite.

WAV, FLAC, OGG/Vorbis/Opus and MP3 are read with soundfile, as every stage reads audio. What browsers
and phones record, WebM/Opus (MediaRecorder in Chrome and Firefox) and M4A/AAC (Safari, iOS and
Android recorders), libsndfile cannot open; those go through PyAV, FFmpeg's maintained binding, which
stops at ``max_s`` of decoded audio because a recording made by MediaRecorder states no duration.
Reads nothing but the bytes given; writes nothing.

  wave, rate = read_upload(data, "clip.webm", max_s=600)   # float32 (frames, channels); AudioError
"""

from __future__ import annotations

import io

import numpy as np

from funasr_recipe.features.audio import AudioError, AudioInfo, decode_audio_bytes

# Below 4 kHz there is no speech band to hear; above 384 kHz no recorder writes (the highest rate
# of studio converters). Outside, a header is a mistake or an attack (1e8 Hz made torchaudio's mel
# banks fail an assertion, a 500).
MIN_RATE, MAX_RATE = 4_000, 384_000
# Codecs' frames pad the last one; a container's stated duration may pass the decoded audio by this.
CUT_SLACK_S = 0.1


def check_rate(rate: float, name: str) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError("bad_sample_rate", f"{name}: a sample rate of {rate:g} Hz is outside "
                         f"{MIN_RATE}-{MAX_RATE} Hz")


def too_long(seconds: float, max_s: float, name: str) -> AudioError:
    return AudioError("too_long", f"{name}: {seconds:.1f} s of audio is over the limit of {max_s:g} s")


def read_upload(data: bytes, name: str, max_s: float) -> tuple[np.ndarray, int]:
    """float32 (frames, channels) and the rate of an uploaded audio file of at most ``max_s`` seconds.

    Raises AudioError: empty_file, unreadable_audio, truncated_audio, empty_audio, bad_sample_rate,
    too_long, non_finite_audio.
    """

    def check(info: AudioInfo) -> None:
        check_rate(info.sample_rate, name)
        if info.duration > max_s:
            raise too_long(info.duration, max_s, name)

    try:
        wave, rate = decode_audio_bytes(data, name, check)
    except AudioError as e:
        if e.reason != "unreadable_audio":
            raise
        wave, rate = decode_container(data, name, max_s, e)
    bad = int(np.count_nonzero(~np.isfinite(wave)))
    if bad:
        raise AudioError("non_finite_audio", f"{name}: {bad} of {wave.size} samples are NaN or infinite")
    return wave, rate


def decode_container(data: bytes, name: str, max_s: float, unreadable: AudioError) -> tuple[np.ndarray, int]:
    """The first audio stream of a container FFmpeg reads (WebM, Matroska, MP4/M4A, ...), decoded frame
    by frame and refused as soon as it passes ``max_s``; ``unreadable`` (soundfile's error) is raised
    when FFmpeg cannot read it either."""
    import av

    chunks: list[np.ndarray] = []
    frames = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise unreadable
            stream = container.streams.audio[0]
            rate = int(stream.codec_context.sample_rate or 0)
            check_rate(rate, name)
            if container.duration is not None and container.duration / 1e6 > max_s + 1.0:
                raise too_long(container.duration / 1e6, max_s, name)  # from the header, when it has one
            resampler = None
            for frame in container.decode(stream):
                if resampler is None:  # packed float32 at the stream's own rate and layout
                    resampler = av.AudioResampler(format="flt", layout=frame.layout.name, rate=rate)
                    channels = frame.layout.nb_channels
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1, channels)
                    chunks.append(chunk)
                    frames += len(chunk)
                if frames > max_s * rate:
                    raise too_long(frames / rate, max_s, name)
            if resampler is not None:
                for out in resampler.resample(None):
                    chunk = out.to_ndarray().reshape(-1, channels)
                    chunks.append(chunk)
                    frames += len(chunk)
            stated = container.duration / 1e6 if container.duration is not None else None
    except av.error.FFmpegError as e:
        if chunks:  # the stream broke after some audio: refused rather than transcribed in part
            raise AudioError("truncated_audio", f"{name}: decoding failed after {frames / rate:.2f} s: "
                             f"{e}") from None
        raise unreadable from None
    if not chunks:
        raise AudioError("empty_audio", f"0 samples: {name}")
    # FFmpeg decodes a cut file up to the cut without an error. Where the header states a duration
    # (M4A's moov, a WebM written by a muxer that seeks back) the shortfall shows it; MediaRecorder's
    # WebM states none, and a cut one is transcribed to its cut.
    if stated is not None and frames / rate < stated - CUT_SLACK_S:
        raise AudioError("truncated_audio", f"{name}: the header says {stated:.2f} s, the data ends at "
                         f"{frames / rate:.2f} s")
    return np.concatenate(chunks).astype(np.float32, copy=False), rate
