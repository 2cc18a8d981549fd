"""Stage 1's checks of the merged targets, with the tokenizer training will use: each target normalised,
every one the tokenizer cannot represent listed, and those CTC cannot align to their audio rejected.

Reads  <dump-dir>/<set>/{data.jsonl,feats.scp,rejected.tsv,report.json} as ``dump.merge_set`` wrote them,
       the set's stage-0 <data-dir>/<set>/data.jsonl (to name the line an utterance came from),
       the model's config (funasr's view of it) and its tokenizer;
writes (``normalise_targets``) data.jsonl with every ``target`` in the normalised form that training
       tokenises (the normaliser of data/textnorm.py, which the caller passes in: this layer does not
       import data/) and <dump-dir>/<set>/untokenizable.tsv: file, line, key, reason, transcript,
       normalised, decoded, pieces of every stage-0 utterance whose normalised target encodes to
       <unk> (``unknown_token``) or, through a sentencepiece tokenizer, decodes to other text
       (``round_trip``); listed, not rejected (a word vocabulary smaller than the corpus is a choice),
       each utterance once under its stage-0 key (not once per speed copy); the header alone if none;
writes (``reject_impossible_targets``) the four files without the utterances CTC cannot align: each
       becomes a ``target_too_long_for_audio`` line of rejected.tsv and is counted in report.json;
writes (``write_raw_list``) <dump-dir>/<set>/raw.jsonl: stage 0's entries (audio sources) of the
       utterances the dump kept, with the normalised targets, which ``--feats-type raw`` trains on.

CTC aligns U tokens to T output frames only if T >= U + R, R the number of adjacent equal tokens (a
blank must separate them). Otherwise the loss is infinite, and funasr only warns ``1/58 samples got nan
grad`` and trains on.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from funasr_recipe.core.rejections import BadInputError, Rejection
from funasr_recipe.families.registry import FAMILIES
from funasr_recipe.features.dump import SetPlan, key_origins, speed_key

log = logging.getLogger(__name__)

REASON = "target_too_long_for_audio"
UNTOKENIZABLE_TSV = "untokenizable.tsv"
UNTOKENIZABLE_HEADER = "file\tline\tkey\treason\ttranscript\tnormalised\tdecoded\tpieces\n"
# data/textnorm.py's TextNorm: (transcript, its text_language) -> the text training tokenises.
Normaliser = Callable[[str, str | None], str]


def _sliced(frames: int, cut: int, step: int) -> int:
    return len(range(frames)[:-cut:step])


# Output length of funasr's subsampling input layers (models/transformer/utils/subsampling.py) for T
# input frames, computed as they slice their masks: Conv2dSubsampling's x_mask[:, :, :-2:2][:, :, :-2:2]
# is ((T - 1) // 2 - 1) // 2. Other input layers ("pe", "linear", "embed", None) keep every frame.
SUBSAMPLING: dict[str, Callable[[int], int]] = {
    "conv2d": lambda t: _sliced(_sliced(t, 2, 2), 2, 2),
    "conv2d2": lambda t: _sliced(_sliced(t, 2, 2), 2, 1),
    "conv2d6": lambda t: _sliced(_sliced(t, 2, 2), 4, 3),
    "conv2d8": lambda t: _sliced(_sliced(_sliced(t, 2, 2), 2, 2), 2, 2),
    # Pads 4 frames and counts ((T - 1) // 2 + 1 - 1) // 2 + 1; its convolutions need 3 frames to run.
    "conv2dpad": lambda t: ((t - 1) // 2 + 1 - 1) // 2 + 1 if t >= 3 else 0,
}
# Encoders that take an input_layer option and ignore it: SenseVoiceEncoderSmall always embeds with
# SinusoidalPositionEncoder (its default input_layer, "conv2d", would say 4x).
_NO_SUBSAMPLING = {"SenseVoiceEncoderSmall"}
# Models whose loss always includes CTC on the text tokens. SenseVoiceSmall prepends 4 query frames
# (language, event, emotion, text norm) to the encoder input and takes them off again before its CTC
# (encoder_out[:, 4:], encoder_out_lens - 4, text[:, 4:]): the CTC sees the LFR frames and the text.
_ALWAYS_CTC = {name for name, spec in FAMILIES.items() if spec.always_ctc}


def output_frames(fbank_frames: int, lfr_n: int, input_layer: str | None) -> int:
    """Frames the encoder outputs for ``fbank_frames`` 10 ms fbank frames: funasr's LFR keeps
    ceil(frames / lfr_n), then the encoder's input layer subsamples."""
    lfr = -(-fbank_frames // lfr_n)
    subsample = SUBSAMPLING.get(input_layer or "")
    return lfr if subsample is None else max(0, subsample(lfr))


def ctc_min_frames(ids: Sequence[int]) -> int:
    """Fewest frames a CTC alignment of ``ids`` needs: one a token, and a blank between equal neighbours."""
    return len(ids) + sum(a == b for a, b in zip(ids, ids[1:], strict=False))


@dataclass(frozen=True)
class CtcFrames:
    """How a model turns a clip's fbank frames into the frames its CTC loss aligns."""

    lfr_n: int
    input_layer: str | None

    def frames(self, fbank_frames: int) -> int:
        return output_frames(fbank_frames, self.lfr_n, self.input_layer)

    def problem(self, ids: Sequence[int], fbank_frames: int) -> str | None:
        """None where CTC can align ``ids`` to the clip, else what is wrong (the rejection's detail)."""
        need, have = ctc_min_frames(ids), self.frames(fbank_frames)
        if have >= need:
            return None
        repeats = f" and {need - len(ids)} repeats" if need > len(ids) else ""
        return (f"{len(ids)} tokens{repeats} need {need} CTC frames; the audio gives {have} model output "
                f"frames ({fbank_frames} fbank frames, LFR n={self.lfr_n}, input layer {self.input_layer})")


def _default(table: str, name: str | None, param: str) -> Any:
    """The default of ``param`` of a class in funasr's registry, or None."""
    from funasr.register import tables

    cls = getattr(tables, table, {}).get(name) if name else None
    if cls is None:
        return None
    p = inspect.signature(cls.__init__).parameters.get(param)
    return None if p is None or p.default is inspect.Parameter.empty else p.default


def ctc_frames(model_cfg: Mapping, lfr_n: int) -> CtcFrames | None:
    """How the model of a config (funasr's, after any pretrained config is merged) counts its CTC frames,
    or None for a model whose loss has no CTC term (a Paraformer with ``ctc_weight: 0``). Unset options
    take the class's own defaults, from funasr's registry."""
    model = model_cfg.get("model")
    model_conf = model_cfg.get("model_conf") or {}
    if model not in _ALWAYS_CTC:
        if "ctc_weight" in model_conf:
            weight = model_conf["ctc_weight"]
        else:
            weight = _default("model_classes", model, "ctc_weight")
        if not weight:
            return None
    encoder = model_cfg.get("encoder")
    if encoder in _NO_SUBSAMPLING:
        return CtcFrames(lfr_n, None)
    conf = model_cfg.get("encoder_conf") or {}
    if "input_layer" in conf:
        return CtcFrames(lfr_n, conf["input_layer"])
    return CtcFrames(lfr_n, _default("encoder_classes", encoder, "input_layer"))


def load_tokenizer(model_cfg: Mapping) -> Any:
    """The tokenizer funasr builds for a config: ``tokenizer_classes[tokenizer](**tokenizer_conf)``."""
    from funasr.register import tables

    name = model_cfg.get("tokenizer")
    cls = tables.tokenizer_classes.get(name) if name else None
    if cls is None:
        raise BadInputError(f"tokenizer {name!r} is not one of funasr's {sorted(tables.tokenizer_classes)}")
    return cls(**(model_cfg.get("tokenizer_conf") or {}))


def _sentencepiece(tokenizer: Any) -> Any:
    """The SentencePieceProcessor of a funasr sentencepiece tokenizer (built lazily there), else None."""
    build = getattr(tokenizer, "_build_sentence_piece_processor", None)
    if callable(build):
        build()
    return getattr(tokenizer, "sp", None)


def vocab_pieces(tokenizer: Any) -> list[str] | None:
    """Every piece of a funasr tokenizer's vocabulary in id order (sentencepiece's, or the token list of
    a CharTokenizer), or None where it has neither: data/textnorm.py reads its case convention."""
    sp = _sentencepiece(tokenizer)
    if sp is not None:
        return [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
    token_list = getattr(tokenizer, "token_list", None)
    return [str(t) for t in token_list] if token_list else None


def _target_len(target: str) -> int:
    # data/manifest.py's rule (funasr's scp2jsonl): words when there are spaces, else characters.
    return len(target.split()) if " " in target else len(target)


def _tokenisation(tokenizer: Any) -> Callable[[str], tuple[str, str, str] | None]:
    """text -> None where the tokenizer represents it, else (reason, decoded text, pieces)."""
    sp = _sentencepiece(tokenizer)
    unk = sp.unk_id() if sp is not None else getattr(tokenizer, "unk_id", None)
    token_list = getattr(tokenizer, "token_list", None)

    def pieces(ids: Sequence[int]) -> str:
        if sp is not None:
            return " ".join(sp.IdToPiece(int(i)) for i in ids)
        return " ".join(str(token_list[i]) if token_list else str(i) for i in ids)

    def check(text: str) -> tuple[str, str, str] | None:
        ids = list(tokenizer.encode(text))
        decoded = str(tokenizer.decode(ids))
        if unk is not None and unk in ids:
            return "unknown_token", decoded, pieces(ids)
        # Only sentencepiece decodes back to the text with its spaces; a CharTokenizer joins its tokens
        # without them by design, so there only <unk> says that text was lost.
        if sp is not None and decoded != text:
            return "round_trip", decoded, pieces(ids)
        return None

    return lru_cache(maxsize=1 << 14)(check)  # speed copies share a target


def _cell(text: str) -> str:
    # tabs and line ends inside a cell would shift the columns or split the row
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


def normalise_targets(plan: SetPlan, tokenizer: Any | None, normalise: Normaliser) -> int:
    """Rewrite every target of a merged set in its normalised form and, given the tokenizer training will
    use, list in untokenizable.tsv each utterance whose normalised target it cannot represent; returns how
    many are listed (module docstring: the columns)."""
    data = plan.out / "data.jsonl"
    tmp = data.with_name(data.name + ".tmp")
    check = None if tokenizer is None else _tokenisation(tokenizer)
    bad: dict[str, tuple[int, str, str, tuple[str, str, str]]] = {}  # dump key -> (line, texts, problem)
    changed = total = 0
    with open(data, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as out:
        for lineno, line in enumerate(src, 1):
            total = lineno
            obj = json.loads(line)
            original = obj["target"]
            text = normalise(original, obj.get("text_language"))
            if text != original:
                obj["target"], obj["target_len"] = text, _target_len(text)
                line = json.dumps(obj, ensure_ascii=False) + "\n"
                changed += 1
            out.write(line)
            if check is not None and (problem := check(text)) is not None:
                bad[obj["key"]] = (lineno, original, text, problem)
    if changed:
        tmp.replace(data)
    else:
        tmp.unlink()
    described = getattr(normalise, "describe", None)
    log.info("%s: %d of %d targets normalised (%s)", plan.out, changed, total,
             described() if callable(described) else normalise)
    if check is None:
        log.warning("%s: untokenizable-target check skipped: no tokenizer at hand", plan.out)
        return 0
    origins = key_origins(plan, set(bad)) if bad else {}
    rows: dict[str, tuple[int, str, str]] = {}  # stage-0 key -> (line, reason, row): speed copies once
    for key, (lineno, original, text, (reason, decoded, pieces)) in bad.items():
        where, line_no, name = ((str(plan.jsonl), *origins[key][0][:2]) if origins.get(key)
                                else (str(data), lineno, key))
        cells = (where, str(line_no), name, reason, original, text, decoded, pieces)
        rows.setdefault(name, (line_no, reason, "\t".join(_cell(c) for c in cells) + "\n"))
    listing = plan.out / UNTOKENIZABLE_TSV
    with open(listing, "w", encoding="utf-8") as f:
        f.write(UNTOKENIZABLE_HEADER)
        f.writelines(row for _, _, row in sorted(rows.values()))
    if rows:
        unknown = sum(reason == "unknown_token" for _, reason, _ in rows.values())
        log.warning("%s: %d utterances have a target the tokenizer cannot represent (%d with <unk>, %d that "
                    "decode to other text): training learns them as it tokenises them; each is listed, "
                    "with its key, in %s", plan.out, len(rows), unknown, len(rows) - unknown, listing)
    else:
        log.info("%s: all %d targets survive tokenisation", plan.out, total)
    return len(rows)


def reject_impossible_targets(plan: SetPlan, ctc: CtcFrames, encode: Callable[[str], Sequence[int]],
                              frame_shift_ms: float, strict: bool) -> int:
    """Take the utterances whose target CTC cannot align out of a merged set; returns how many.

    The training set's CMVN keeps their frames: a handful of utterances does not move a global mean.
    """
    data = plan.out / "data.jsonl"
    count = lru_cache(maxsize=1 << 14)(lambda text: tuple(encode(text)))  # speed copies share a target
    bad: dict[str, tuple[int, int, str]] = {}  # key -> (line of the dump's data.jsonl, frames, detail)
    checked = 0
    with open(data, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            checked = lineno
            obj = json.loads(line)
            if (detail := ctc.problem(count(obj["target"]), obj["source_len"])) is not None:
                bad[obj["key"]] = (lineno, obj["source_len"], detail)
                if strict:
                    break
    if not bad:
        log.info("%s: all %d targets fit their audio for CTC (output frames: LFR n=%d, then encoder input "
                 "layer %s)", plan.out, checked, ctc.lfr_n, ctc.input_layer)
        return 0
    origins = key_origins(plan, set(bad))
    rejections = [Rejection(str(plan.jsonl), origins[key][0][0], key, REASON, detail) if origins.get(key)
                  else Rejection(str(data), lineno, key, REASON, detail)
                  for key, (lineno, _, detail) in bad.items()]
    if strict:
        raise rejections[0].fatal()
    dropped = {lineno for lineno, _, _ in bad.values()}
    _rewrite(data, lambda n, _: n not in dropped)
    _rewrite(plan.out / "feats.scp", lambda _, line: line.split(" ", 1)[0] not in bad)
    with open(plan.out / "rejected.tsv", "a", encoding="utf-8") as f:
        f.writelines(r.tsv() for r in rejections)
    _update_report(plan.out / "report.json", len(bad), sum(frames for _, frames, _ in bad.values()),
                   frame_shift_ms)
    log.warning("%s: %d utterances rejected (%s): their targets have more tokens than CTC can align to "
                "their audio; listed in %s", plan.out, len(bad), REASON, plan.out / "rejected.tsv")
    return len(bad)


def write_raw_list(plan: SetPlan) -> Path:
    """<dump-dir>/<set>/raw.jsonl: the stage-0 lines of the utterances the merged set kept (its unperturbed
    copies: the same keys), each with the dump's normalised target, so that training on the audio
    (``--feats-type raw``) sees the targets and the utterances training on features sees.

    One pass over each file, side by side: the dump lists its unperturbed copies in stage 0's order (the
    shards are runs of stage-0 lines, rejections only take lines out), so nothing per utterance is held."""
    copies = tuple(speed_key("", f) for f in plan.factors if f != 1.0)

    def kept() -> Iterator[dict]:
        with open(plan.out / "data.jsonl", encoding="utf-8") as f:
            for line in f:
                obj = json.loads(line)
                # stage 1 writes "speed"; without it, the key says (sp<factor>-<key>).
                if obj["speed"] == 1.0 if "speed" in obj else not obj["key"].startswith(copies):
                    yield obj

    dumped = kept()
    want = next(dumped, None)
    out = plan.out / "raw.jsonl"
    tmp = out.with_name(out.name + ".tmp")
    with open(plan.jsonl, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
        for line in src:
            obj = json.loads(line)
            if want is not None and obj["key"] == want["key"]:
                obj["target"], obj["target_len"] = want["target"], want["target_len"]
                dst.write(json.dumps(obj, ensure_ascii=False) + "\n")
                want = next(dumped, None)
    if want is not None:
        raise ValueError(f"{plan.out / 'data.jsonl'}: utterance {want['key']} is not in {plan.jsonl} at its "
                         "place in stage 0's order (the dump does not follow it); rerun stage 1")
    tmp.replace(out)
    return out


def _rewrite(path: Path, keep: Callable[[int, str], bool]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(path, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as out:
        out.writelines(line for n, line in enumerate(src, 1) if keep(n, line))
    tmp.replace(path)


def _update_report(path: Path, n: int, frames: int, frame_shift_ms: float) -> None:
    report = json.loads(path.read_text(encoding="utf-8"))
    report["accepted"] -= n
    report["rejected"] += n
    reasons = {**report["rejected_by_reason"], REASON: report["rejected_by_reason"].get(REASON, 0) + n}
    report["rejected_by_reason"] = dict(sorted(reasons.items()))
    report["frames"] -= frames
    # The dump keeps no durations: one frame shift per frame is each clip's length within 25 ms.
    report["hours"] = round(max(0.0, report["hours"] - frames * frame_shift_ms / 1000 / 3600), 4)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if not report["accepted"]:
        raise BadInputError(f"{path.parent}: no utterance left after the target-length check; see "
                            f"{path.parent / 'rejected.tsv'}")
