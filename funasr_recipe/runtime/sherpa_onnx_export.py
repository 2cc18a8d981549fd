"""What sherpa-onnx's SenseVoice loader needs beside an export's ONNX files (stage 4 writes it).

Reads  an export dir of runtime/export.py: export.json (the family), config.yaml (frontend_conf,
       model_conf, tokenizer_conf), am.mvn, and the sentencepiece model (or tokens.json);
writes the model metadata into <dir>/model.onnx and <dir>/model_quant.onnx, in place, and
       <dir>/tokens.txt ("piece id" per line, every id of the vocabulary).

sherpa-onnx loads a SenseVoice model with ``OfflineRecognizer.from_sense_voice(model, tokens)`` and reads
its settings from the graph's metadata, not from config.yaml or am.mvn: the keys in ``REQUIRED_KEYS``
(sherpa-onnx/csrc/offline-sense-voice-model.cc reads them with SHERPA_ONNX_READ_META_DATA and exits the
process, not raises, when one is missing) plus those its export script (scripts/sense-voice/
export-onnx.py) writes for the record. It computes the rest itself: kaldi-native-fbank (hamming window,
snip edges, scaled to the int16 range when normalize_samples is 0), LFR, then CMVN with neg_mean and
inv_stddev (am.mvn's <AddShift> and <Rescale>). It runs the graph's inputs in order (features,
lengths, language, text_norm) and takes its first output as the logits, so funasr's export (speech,
speech_lengths, language, textnorm -> ctc_logits, encoder_out_lens) loads unchanged.

Only SenseVoiceSmall: sherpa-onnx's Paraformer and CTC loaders expect graphs of their own export
scripts, which funasr's export does not write; the other families get nothing here.

  written = write_sherpa_files(Path("exp/tiny_sensevoice/export"))  # [] for another family
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import yaml

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.families.registry import SHERPA_ONNX, family_spec, supporting
from funasr_recipe.features.cmvn import read_am_mvn
from funasr_recipe.features.fbank_conf import FbankConf
from funasr_recipe.runtime.onnx_asr import export_family

log = logging.getLogger(__name__)
(FAMILY,) = supporting(SHERPA_ONNX)  # the one family whose loader sherpa-onnx has (offline SenseVoice)
SPEC = family_spec(FAMILY)
MODEL_FILES = ("model.onnx", "model_quant.onnx")
TOKENS = "tokens.txt"
# What the C++ loader reads without a default (sherpa-onnx 2.0.1): a missing one ends the process.
REQUIRED_KEYS = ("vocab_size", "lfr_window_size", "lfr_window_shift", "normalize_samples", "with_itn",
                 "without_itn", "lang_auto", "lang_zh", "lang_en", "lang_ja", "lang_ko", "lang_yue",
                 "neg_mean", "inv_stddev")
# What sherpa-onnx's frontend fixes whatever the model says (InitFeatConfig and kaldi-native-fbank's
# defaults): an export whose frontend differs would get other features there.
SHERPA_FRONTEND = {"window": "hamming", "frame_length": 25.0, "frame_shift": 10.0, "snip_edges": True}


def _vocabulary(export_dir: Path, config: dict) -> list[str]:
    bpemodel = (config.get("tokenizer_conf") or {}).get("bpemodel")
    if bpemodel:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(export_dir / Path(bpemodel).name))
        return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return json.loads((export_dir / "tokens.json").read_text(encoding="utf-8"))


def _floats(values: np.ndarray) -> str:
    # repr of each float32 as a double: sherpa-onnx parses it back to the same float32 the recipe uses.
    return ",".join(repr(float(v)) for v in values)


def sherpa_metadata(export_dir: Path, config: dict, vocab_size: int) -> dict[str, str]:
    """The metadata sherpa-onnx's SenseVoice loader reads, from an export dir's config and am.mvn."""
    fbank = FbankConf.from_frontend_conf(config.get("frontend_conf") or {})
    shift, scale = read_am_mvn(export_dir / "am.mvn")
    if shift.shape[0] != fbank.n_mels * fbank.lfr_m:
        raise BadInputError(f"{export_dir / 'am.mvn'}: {shift.shape[0]} dims, the frontend gives "
                            f"{fbank.n_mels} x lfr_m {fbank.lfr_m}")
    return {
        "model_type": "sense_voice_ctc",
        # sherpa-onnx's "version 2" means int8 weights in QUInt8, as funasr's quantisation writes them.
        "version": "2",
        "comment": "SenseVoiceSmall exported by funasr_recipe (runtime/export.py)",
        "vocab_size": str(vocab_size),
        "blank_id": str(int((config.get("model_conf") or {}).get("blank_id", 0))),
        "lfr_window_size": str(fbank.lfr_m),
        "lfr_window_shift": str(fbank.lfr_n),
        # 0: samples scaled to the int16 range before the fbank, as funasr's WavFrontend does.
        "normalize_samples": "0",
        "neg_mean": _floats(shift),
        "inv_stddev": _floats(scale),
        **{f"lang_{name}": str(i) for name, i in SPEC.language_ids.items()},
        "with_itn": str(SPEC.textnorm_ids["withitn"]),
        "without_itn": str(SPEC.textnorm_ids["woitn"]),
    }


def frontend_mismatches(config: dict) -> list[str]:
    """The frontend settings of a config that sherpa-onnx's SenseVoice frontend would not reproduce."""
    fbank = FbankConf.from_frontend_conf(config.get("frontend_conf") or {})
    return [f"{k} {getattr(fbank, k)!r} (sherpa-onnx: {v!r})" for k, v in SHERPA_FRONTEND.items()
            if getattr(fbank, k) != v]


def add_metadata(path: Path, meta: dict[str, str]) -> None:
    """Set ``meta`` in an ONNX file's metadata_props, in place (other keys kept), atomically."""
    model = onnx.load(str(path))
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in meta]
    del model.metadata_props[:]
    for key, value in [*kept, *meta.items()]:
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    write_atomic(path, model.SerializeToString())


def tokens_txt(vocabulary: list[str]) -> str:
    """tokens.txt: "piece id" per line, as sherpa-onnx's SymbolTable reads it (split on whitespace)."""
    bad = [(i, p) for i, p in enumerate(vocabulary) if not p or len(p.split()) != 1 or p.strip() != p]
    if bad:
        raise BadInputError(f"tokens {bad[:3]} are empty or hold whitespace: tokens.txt cannot carry them")
    return "".join(f"{piece} {i}\n" for i, piece in enumerate(vocabulary))


def write_sherpa_files(export_dir: Path) -> list[Path]:
    """Metadata in both ONNX files and tokens.txt, for a SenseVoiceSmall export; [] for another family
    or a frontend sherpa-onnx would not reproduce (logged). Returns the files written."""
    export_dir = Path(export_dir)
    config = yaml.safe_load((export_dir / "config.yaml").read_text(encoding="utf-8"))
    family = export_family(export_dir, config)
    if family != FAMILY:
        log.info("%s: no sherpa-onnx files for %s: the recipe targets sherpa-onnx's SenseVoice loader only",
                 export_dir, family)
        return []
    mismatches = frontend_mismatches(config)
    if mismatches:
        log.warning("%s: no sherpa-onnx files: its SenseVoice frontend fixes %s", export_dir,
                    "; ".join(mismatches))
        return []
    vocabulary = _vocabulary(export_dir, config)
    meta = sherpa_metadata(export_dir, config, len(vocabulary))
    written = []
    for name in MODEL_FILES:
        add_metadata(export_dir / name, meta)
        written.append(export_dir / name)
    write_atomic(export_dir / TOKENS, tokens_txt(vocabulary))
    written.append(export_dir / TOKENS)
    log.info("%s: sherpa-onnx metadata (%d keys) in %s; %s", export_dir, len(meta), ", ".join(MODEL_FILES),
             TOKENS)
    return written


def missing_sherpa_files(export_dir: Path) -> list[str]:
    """What an export dir lacks for sherpa-onnx's SenseVoice loader ([] when it would load): tokens.txt,
    or a model file without one of REQUIRED_KEYS. Checked here because sherpa-onnx exits the process."""
    export_dir = Path(export_dir)
    missing = [] if (export_dir / TOKENS).is_file() else [TOKENS]
    for name in MODEL_FILES:
        path = export_dir / name
        if not path.is_file():
            missing.append(name)
            continue
        keys = {p.key for p in onnx.load(str(path), load_external_data=False).metadata_props}
        missing += [f"{name}:{k}" for k in REQUIRED_KEYS if k not in keys]
    return missing
