"""sherpa-onnx (k2-fsa's C++ runtime) on an export dir: to compare with (stage 5's benchmark) and to check
that the export loads in it (stage 4, tests). Not the recipe's inference path (runtime/onnx_asr.py is).

Reads an export dir with sherpa-onnx's files (runtime/sherpa_onnx_export.py: the metadata in model.onnx
and model_quant.onnx, tokens.txt; config.yaml for the sample rate and mel bins) and audio files (any
rate, any channels); returns texts. Audio is read with soundfile and resampled to the model's rate with
the recipe's resampler (features/fbank.py, torchaudio's sinc, what AutoModel and the recipe's runtime
do) before sherpa-onnx sees it, so that every runtime gets the same samples and a comparison measures
runtimes, not resamplers: sherpa-onnx resamples other rates with a filter of its own (on the demo's
8 kHz dev set its transcripts were the same either way, 500 of 500), and funasr-onnx's soxr resampling
of those files changes 22% of its transcripts.

How sherpa-onnx (2.0.1) joins the pieces, against sentencepiece (``sp.decode``, what AutoModel and the
recipe's runtime do): it drops the first 4 decoded tokens whatever they are (SenseVoice's language,
emotion, event and ITN tags; the others keep the tags in the text, ``data.tags.strip_tags`` removes
them), turns the leading "▁" of each piece (only the leading one) into a space, concatenates and trims
the text's ends. For sentencepiece's pieces, which hold "▁" only at their start, that is sentencepiece's
text; ``sherpa_text`` collapses whitespace as ``strip_tags`` does for the others, so that the texts
compare equal where the tokens are the same (tests/unit/runtime/test_runtime_words.py).

sherpa-onnx ends the process (exit, no exception) on an export it cannot load, so a check goes through a
child process: ``sherpa_subprocess``; ``python -m funasr_recipe.runtime.sherpa_onnx_runtime`` is that
child (and a command-line transcriber).

  asr = SherpaASR("exp/tiny_sensevoice/export", quantize=True, threads=2, batch_size=8)
  asr(["a.wav", "b.wav"])  # -> ["SEVEN", ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from funasr_recipe.core.env import available_cores
from funasr_recipe.features.audio import load_audio
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.features.numpy_fbank import mono_at_rate
from funasr_recipe.runtime.onnx_asr import export_family
from funasr_recipe.runtime.sherpa_onnx_export import FAMILY, TOKENS, missing_sherpa_files

CHILD_TIMEOUT_S = 600


def sherpa_text(text: str) -> str:
    """A sherpa-onnx transcript with whitespace collapsed (module docstring), as ``strip_tags`` leaves
    the others'."""
    return " ".join(text.split())


class SherpaASR:
    """sherpa-onnx's SenseVoice recogniser on an export dir: paths (any rate, any channels) or arrays at
    the model's rate in, texts out (tags dropped), ``batch_size`` utterances per decode_streams call."""

    def __init__(self, export_dir: str | Path, quantize: bool = False, threads: int | None = None,
                 batch_size: int = 1, language: str = "auto", use_itn: bool = False) -> None:
        self.dir = Path(export_dir)
        config = yaml.safe_load((self.dir / "config.yaml").read_text(encoding="utf-8"))
        family = export_family(self.dir, config)
        if family != FAMILY:
            raise RuntimeError(f"sherpa-onnx: the recipe targets its {FAMILY} loader only, not {family}")
        missing = missing_sherpa_files(self.dir)
        if missing:  # checked here: sherpa-onnx would end this process on them
            more = ", ..." if len(missing) > 4 else ""
            raise RuntimeError(f"{self.dir} lacks what sherpa-onnx reads ({', '.join(missing[:4])}{more}): "
                               "rerun stage 4 (python -m local.export ... --check-only writes them into an "
                               "existing export)")
        import sherpa_onnx

        fbank = FbankConf.from_frontend_conf(config.get("frontend_conf") or {})
        self.fs = fbank.fs
        self.model_file = self.dir / ("model_quant.onnx" if quantize else "model.onnx")
        self.recognizer = sherpa_onnx.OfflineRecognizer.from_sense_voice(
            model=str(self.model_file), tokens=str(self.dir / TOKENS),
            num_threads=threads or available_cores(), sample_rate=self.fs, feature_dim=fbank.n_mels,
            language=language, use_itn=use_itn)
        self.batch_size = batch_size

    def _wave(self, item: str | np.ndarray) -> np.ndarray:
        if isinstance(item, np.ndarray):
            return np.asarray(item, dtype=np.float32)
        return mono_at_rate(*load_audio(item), self.fs)

    def _batch(self, items: Sequence[str | np.ndarray]) -> list[str]:
        streams = []
        for item in items:
            stream = self.recognizer.create_stream()
            stream.accept_waveform(self.fs, self._wave(item))
            streams.append(stream)
        if len(streams) == 1:
            self.recognizer.decode_stream(streams[0])
        else:  # one padded batch through the network, as the recipe's runtime batches
            self.recognizer.decode_streams(streams)
        return [sherpa_text(s.result.text) for s in streams]

    def __call__(self, items: str | np.ndarray | Sequence[str | np.ndarray]) -> list[str]:
        if isinstance(items, (str, np.ndarray)):
            items = [items]
        return [t for i in range(0, len(items), self.batch_size)
                for t in self._batch(items[i:i + self.batch_size])]


def sherpa_subprocess(export_dir: Path, sources: list[str], quantize: bool = False, threads: int = 1,
                      batch_size: int = 1, timeout: float = CHILD_TIMEOUT_S) -> list[str]:
    """``SherpaASR`` texts of ``sources`` computed in a child process; RuntimeError with the child's last
    words when it fails (sherpa-onnx exits on a key it misses, which would end this process)."""
    cmd = [sys.executable, "-m", __name__, str(export_dir), *sources, "--threads", str(threads),
           "--batch-size", str(batch_size), "--json", *(["--int8"] if quantize else [])]
    root = str(Path(__file__).resolve().parents[2])  # the dir holding funasr_recipe/, wherever we run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"sherpa-onnx on {export_dir}: no answer in {timeout:g} s") from None
    if res.returncode != 0:
        # Its last line: a Python exception, or sherpa-onnx's own message before it exits.
        last = (res.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"sherpa-onnx on {export_dir} exited {res.returncode}: {last}")
    texts = json.loads(res.stdout.strip().splitlines()[-1])
    if len(texts) != len(sources):
        raise RuntimeError(f"sherpa-onnx on {export_dir}: {len(texts)} texts for {len(sources)} files")
    return texts


def sherpa_check(export_dir: Path, family: str, sources: list[str], threads: int) -> dict:
    """Stage 4's check that sherpa-onnx loads the export, fp32 and int8, and its texts of a few files;
    for a family it has no loader for here, say so instead. Never raises: a failure is reported."""
    if family != FAMILY:
        return {"runtime": None, "note": f"sherpa-onnx files are written for {FAMILY} only"}
    report: dict = {"runtime": "sherpa_onnx.OfflineRecognizer.from_sense_voice", "ok": True}
    for name, quantize in (("fp32", False), ("int8", True)):
        try:
            report[name] = sherpa_subprocess(export_dir, sources, quantize, threads)
        except RuntimeError as e:
            report.update(ok=False, error=str(e))
            break
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export_dir", type=Path, help="export dir with sherpa-onnx's files (stage 4)")
    parser.add_argument("audio", nargs="+", help="audio files (any rate and channel count soundfile reads)")
    parser.add_argument("--int8", action="store_true", help="model_quant.onnx instead of model.onnx")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=available_cores(), help="default: the cores available")
    parser.add_argument("--json", action="store_true", help="one JSON list of the texts instead of lines")
    args = parser.parse_args(argv)
    texts = SherpaASR(args.export_dir, args.int8, args.threads, args.batch_size)(args.audio)
    if args.json:
        print(json.dumps(texts, ensure_ascii=False))
    else:
        for path, text in zip(args.audio, texts, strict=True):
            print(f"{path}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
