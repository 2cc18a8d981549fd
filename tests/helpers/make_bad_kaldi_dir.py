"""Build a Kaldi data dir holding good utterances and one utterance of every kind of bad input.

Reads real 8 kHz wavs (by default corpora/free-spoken-digit-dataset/recordings of this repo); writes
OUT_DIR/{wav.scp,text,utt2spk,spk2utt,utt2lang,utt2emo,utt2event}, the audio they point to under
OUT_DIR/audio/, and OUT_DIR/expected.json: utterance key -> the reason stage 0 must reject it with
(``"ok"`` for the accepted ones), for the validator's default options (``--allow-pipes false``,
``--max-duration 60``). Every rejected key has exactly one problem; ``REJECTED_IN`` names the Kaldi
file that ``rejected.tsv`` must point at. Keys are ``<speaker>-<case>`` (``KEY`` maps a case name such
as ``ok_tagged`` to its key); the files are Kaldi-sorted (byte order of keys). Good and bad cases are
dealt round-robin to four speakers, so that any speaker-disjoint split of the dir (recipes/kaldi holds
out dev speakers) leaves accepted utterances on both sides.

  python -m tests.helpers.make_bad_kaldi_dir OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WAV_DIR = REPO_ROOT / "corpora" / "free-spoken-digit-dataset" / "recordings"
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# case name -> (expected reason with the default options, Kaldi file rejected.tsv must name)
CASES: dict[str, tuple[str, str | None]] = {
    "bad_control_ascii": ("control_chars", "text"),  # BEL inside the transcript
    "bad_control_c1": ("control_chars", "text"),  # U+009B (a C1 control) inside the transcript
    "bad_control_path": ("control_chars", "wav.scp"),  # \x01 in the (existing) file's name
    "bad_dup_text": ("duplicate_key", "text"),  # two lines in text
    "bad_dup_wav": ("duplicate_key", "wav.scp"),  # two lines in wav.scp, both readable
    "bad_empty_audio": ("empty_audio", "wav.scp"),  # valid header, 0 samples
    "bad_empty_text": ("empty_transcript", "text"),  # the key alone on its line
    "bad_malformed": ("malformed_line", "wav.scp"),  # a wav.scp line without a path
    "bad_mangled_header": ("unreadable_audio", "wav.scp"),  # RIFF/WAVE intact, fmt says 0 channels
    "bad_missing_file": ("missing_file", "wav.scp"),
    "bad_non_audio": ("unreadable_audio", "wav.scp"),  # a text file named .wav
    "bad_non_utf8": ("non_utf8", "text"),  # latin-1 bytes in the transcript
    "bad_only_text": ("missing_in_wav_scp", "text"),
    "bad_only_wav": ("missing_in_text", "wav.scp"),
    "bad_random_bytes": ("unreadable_audio", "wav.scp"),
    "bad_too_long": ("too_long", "wav.scp"),  # real wavs concatenated to long_seconds
    "bad_truncated": ("truncated_audio", "wav.scp"),  # a real wav cut in half, header unchanged
    "bad_unknown_emotion": ("unknown_emotion", "utt2emo"),
    "bad_unknown_event": ("unknown_event", "utt2event"),
    "bad_unknown_language": ("unknown_language", "utt2lang"),
    "bad_ws_text": ("empty_transcript", "text"),  # whitespace only after the key
    "ok_16k": ("ok", None),  # 16 kHz mono PCM_16: nothing to convert
    "ok_24bit": ("ok", None),  # 16 kHz mono PCM_24: requantized
    "ok_8k_a": ("ok", None),  # the corpus' own 8 kHz mono PCM_16 files: resampled
    "ok_8k_b": ("ok", None),
    "ok_8k_c": ("ok", None),
    "ok_nonascii_path": ("ok", None),
    "ok_space_path": ("ok", None),
    "ok_stereo": ("ok", None),  # 16 kHz stereo PCM_16: downmixed
    "ok_tagged": ("ok", None),  # utt2lang zh, utt2emo HAPPY, utt2event Laughter
    "ok_ws_collapse": ("ok", None),  # transcript with runs of spaces and tabs
    "pipe_cat": ("pipe_refused", "wav.scp"),  # `cat x.wav |`
    "pipe_fail": ("pipe_refused", "wav.scp"),  # `cat missing.wav |`
}
SPEAKERS = ("spk1", "spk2", "spk3", "spk4")
_GOOD = sorted(n for n, (r, _) in CASES.items() if r == "ok")
_BAD = sorted(n for n, (r, _) in CASES.items() if r != "ok")
KEY: dict[str, str] = {n: f"{SPEAKERS[i % len(SPEAKERS)]}-{n}" for group in (_GOOD, _BAD)
                       for i, n in enumerate(group)}
EXPECTED: dict[str, str] = {KEY[n]: reason for n, (reason, _) in CASES.items()}
REJECTED_IN: dict[str, str] = {KEY[n]: f for n, (_, f) in CASES.items() if f is not None}
# How the pipe entries end with --allow-pipes true (every other key is unchanged).
WITH_PIPES_ALLOWED: dict[str, str] = {KEY["pipe_cat"]: "ok", KEY["pipe_fail"]: "pipe_failed"}
# Tags (by case name) written to utt2lang/utt2emo/utt2event (every other key gets en/NEUTRAL/Speech).
TAGS: dict[str, tuple[str, str, str]] = {
    "ok_tagged": ("zh", "HAPPY", "Laughter"),
    "bad_unknown_language": ("xx", "NEUTRAL", "Speech"),
    "bad_unknown_emotion": ("en", "BORED", "Speech"),
    "bad_unknown_event": ("en", "NEUTRAL", "Whistle"),
}


def _transcript(wav: Path) -> str:
    """The digit word of an FSDD file name ``{digit}_{speaker}_{index}.wav`` ("hello" otherwise)."""
    head = wav.name.split("_", 1)[0]
    return DIGITS[int(head)] if head.isdigit() and int(head) < 10 else "hello"


def _upsample2(x: np.ndarray) -> np.ndarray:
    """Linear interpolation of int16 samples to twice the rate."""
    t = np.arange(2 * len(x)) / 2.0
    return np.round(np.interp(t, np.arange(len(x)), x.astype(np.float64))).astype(np.int16)


def _write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def make_bad_kaldi_dir(out_dir: Path, good_wavs: list[Path], long_seconds: float = 70.0) -> dict[str, str]:
    """Write the Kaldi data dir described in the module docstring; return key -> expected reason.

    ``good_wavs`` are real mono PCM_16 wavs (at least one; files are reused cyclically);
    ``long_seconds`` is the duration of the too-long utterance (longer than the validator's max).
    """
    if not good_wavs:
        raise ValueError("make_bad_kaldi_dir needs at least one real wav")
    out_dir = Path(out_dir).resolve()
    audio = out_dir / "audio"
    if audio.exists():
        shutil.rmtree(audio)
    audio.mkdir(parents=True)
    chosen = list(good_wavs)[:: max(1, len(good_wavs) // 40)][:40]  # spread over digits and speakers
    waves = [sf.read(str(p), dtype="int16") for p in chosen]
    for x, _ in waves:
        if x.ndim != 1:
            raise ValueError("good_wavs must be mono")
    texts = [_transcript(p) for p in chosen]

    def pick(i: int) -> tuple[np.ndarray, int, str]:
        x, sr = waves[i % len(waves)]
        return x, sr, texts[i % len(texts)]

    wav_scp: dict[str, list[str]] = {}  # case name -> its wav.scp values (two for the duplicate)
    text: dict[str, list[bytes]] = {}  # case name -> its text values, as bytes (one is not UTF-8)

    def put(key: str, path: Path | str, transcript: str) -> None:
        wav_scp[key] = [str(path)]
        text[key] = [transcript.encode("utf-8")]

    def write_wav(rel: str, x: np.ndarray, sr: int, subtype: str = "PCM_16") -> Path:
        path = audio / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(path), x, sr, subtype=subtype, format="WAV")
        return path

    # Accepted utterances.
    for n, key in enumerate(("ok_8k_a", "ok_8k_b", "ok_8k_c")):
        x, sr, words = pick(n)
        put(key, write_wav(f"{key}.wav", x, sr), words)
    x, sr, words = pick(3)
    put("ok_16k", write_wav("ok_16k.wav", _upsample2(x), 2 * sr), words)
    x, sr, words = pick(4)
    up = _upsample2(x)
    put("ok_stereo", write_wav("ok_stereo.wav", np.stack([up, up // 2], axis=1), 2 * sr), words)
    x, sr, words = pick(5)
    put("ok_24bit", write_wav("ok_24bit.wav", _upsample2(x), 2 * sr, "PCM_24"), words)
    x, sr, words = pick(6)
    put("ok_space_path", write_wav("with space/my file.wav", x, sr), words)
    x, sr, words = pick(7)
    put("ok_nonascii_path", write_wav("données_语音/ünïcødé.wav", x, sr), words)
    x, sr, words = pick(8)
    put("ok_tagged", write_wav("ok_tagged.wav", x, sr), words)
    x, sr, _ = pick(9)
    put("ok_ws_collapse", write_wav("ok_ws_collapse.wav", x, sr), "one")
    text["ok_ws_collapse"] = [b"  one   two\t three  "]

    # Audio that cannot be used.
    x, sr, words = pick(10)
    put("bad_missing_file", audio / "does_not_exist.wav", words)
    put("bad_random_bytes", audio / "random_bytes.wav", words)
    (audio / "random_bytes.wav").write_bytes(np.random.default_rng(0).bytes(4096))
    header = bytearray(write_wav("mangled_header.wav", x, sr).read_bytes())
    header[22:28] = bytes(6)  # fmt chunk: channels = 0, sample rate = 0
    (audio / "mangled_header.wav").write_bytes(bytes(header))
    put("bad_mangled_header", audio / "mangled_header.wav", words)
    (audio / "not_audio.wav").write_text("this is a transcript, not audio\n" * 40, encoding="utf-8")
    put("bad_non_audio", audio / "not_audio.wav", words)
    longest = max(range(len(waves)), key=lambda i: len(waves[i][0]))
    x, sr, words = pick(longest)
    whole = write_wav("truncated.wav", x, sr).read_bytes()
    (audio / "truncated.wav").write_bytes(whole[: 44 + (len(whole) - 44) // 2])
    put("bad_truncated", audio / "truncated.wav", words)
    put("bad_empty_audio", write_wav("empty.wav", np.zeros(0, np.int16), 16000), words)
    parts, total, i = [], 0.0, 0
    while total <= long_seconds:
        x, sr8, _ = pick(i)
        if sr8 == waves[0][1]:
            parts.append(x)
            total += len(x) / sr8
        i += 1
    long_wav = write_wav("too_long.wav", np.concatenate(parts), waves[0][1])
    put("bad_too_long", long_wav, " ".join(["one"] * len(parts)))
    x, sr, words = pick(11)
    put("bad_control_path", write_wav("control\x01char.wav", x, sr), words)

    # Transcripts that cannot be used.
    for n, (key, value) in enumerate({
        "bad_empty_text": b"",
        "bad_ws_text": b" \t  ",
        "bad_non_utf8": b"caf\xe9 \xff\xfe",
        "bad_control_ascii": b"one\x07two",
        "bad_control_c1": "one\u009btwo".encode(),
    }.items()):
        x, sr, _ = pick(12 + n)
        put(key, write_wav(f"{key}.wav", x, sr), "")
        text[key] = [value]

    # Keys that do not pair up, duplicates, a line without a path, tags.
    x, sr, words = pick(20)
    put("bad_only_wav", write_wav("only_wav.wav", x, sr), words)
    del text["bad_only_wav"]
    text["bad_only_text"] = [words.encode()]
    put("bad_dup_wav", write_wav("dup_wav_1.wav", x, sr), words)
    wav_scp["bad_dup_wav"].append(str(write_wav("dup_wav_2.wav", x, sr)))
    put("bad_dup_text", write_wav("dup_text.wav", x, sr), words)
    text["bad_dup_text"].append(b"two")
    put("bad_malformed", "", words)
    for n, key in enumerate(("bad_unknown_language", "bad_unknown_emotion", "bad_unknown_event")):
        x, sr, words = pick(21 + n)
        put(key, write_wav(f"{key}.wav", x, sr), words)

    # Pipes (refused unless --allow-pipes true).
    x, sr, words = pick(30)
    pipe_src = write_wav("pipe_src.wav", x, sr)
    put("pipe_cat", f"cat {shlex.quote(str(pipe_src))} |", words)
    put("pipe_fail", f"cat {shlex.quote(str(audio / 'no_such_pipe_src.wav'))} |", words)

    assert set(wav_scp) | set(text) == set(CASES), sorted(set(wav_scp) ^ set(CASES))
    names = sorted(CASES, key=KEY.get)  # Kaldi order: by key
    scp_lines = [f"{KEY[n]} {v}".rstrip(" ").encode() for n in names if n in wav_scp for v in wav_scp[n]]
    _write_lines(out_dir / "wav.scp", scp_lines)
    text_lines = [KEY[n].encode() + (b" " + v if v else b"") for n in names if n in text for v in text[n]]
    _write_lines(out_dir / "text", text_lines)
    _write_lines(out_dir / "utt2spk", [f"{KEY[n]} {KEY[n].split('-', 1)[0]}".encode() for n in names])
    _write_lines(out_dir / "spk2utt", [
        " ".join([s, *[KEY[n] for n in names if KEY[n].startswith(f"{s}-")]]).encode() for s in SPEAKERS])
    for column, table in enumerate(("utt2lang", "utt2emo", "utt2event")):
        default = ("en", "NEUTRAL", "Speech")[column]
        _write_lines(out_dir / table, [f"{KEY[n]} {TAGS.get(n, (default,) * 3)[column]}".encode()
                                       for n in names])
    expected = dict(EXPECTED)
    (out_dir / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    return expected


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="Kaldi data dir to write (created)")
    parser.add_argument("--wav-dir", type=Path, default=DEFAULT_WAV_DIR, help="folder of real mono wavs")
    parser.add_argument("--long-seconds", type=float, default=70.0, help="duration of the too-long utterance")
    args = parser.parse_args(argv)
    wavs = sorted(args.wav_dir.glob("*.wav"))
    if not wavs:
        print(f"make_bad_kaldi_dir: no .wav under {args.wav_dir}; pass --wav-dir", file=sys.stderr)
        return 2
    expected = make_bad_kaldi_dir(args.out_dir, wavs, long_seconds=args.long_seconds)
    n_ok = sum(r == "ok" for r in expected.values())
    print(f"wrote {args.out_dir}: {len(expected)} utterances, {n_ok} to accept, {len(expected) - n_ok} "
          f"to reject; expectation in {args.out_dir / 'expected.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
