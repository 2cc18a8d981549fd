"""Score one decode dir: CER, WER and per-language error rates, tag accuracy, alignments.

Reads  <dir>/ref.txt        Kaldi text ``key reference``, one line per utterance of the set;
       <dir>/hyp.txt        ``key hypothesis`` (tags stripped); a key may be missing (failed decode)
                            or stand alone (empty hypothesis): both score as all-deletions, and are
                            listed, unlike funasr's scorer, which skips keys it has no hypothesis for;
       <dir>/ref_tags.tsv   optional, ``key language emotion event``: the language picks each
                            utterance's unit (scoring/error_rate.py) and the per-language rows;
       <dir>/hyp_tags.tsv   optional (SenseVoice), the tags the model emitted, for tag accuracy;
       <dir>/decode.json    optional: model, set, audio/decode seconds, RTF, processes, device.
Writes <dir>/per_utt.txt    every reference utterance, sorted by key: counts and the aligned
                            REF/HYP/EVAL lines in sclite's style (*** for the missing side);
       <dir>/result.txt     the summary for people; <dir>/result.json the same figures for programs
                            (rates are fractions; scoring/results_md.py collects them into RESULTS.md).

Three error rates over the same utterances: CER (characters), WER (words) and "primary", each
utterance in its language's unit (characters for zh/yue/ja, words for en/ko, CJK characters plus
words for unknown or mixed-script text). Texts are normalised first (scoring/error_rate.py says how).
Tag accuracy counts utterances where both sides are known: an empty cell, a missing hypothesis, or a
reference of EMO_UNKNOWN/Event_UNK (annotators did not know either) leaves an utterance out.

  result = score_dir(Path("exp/sensevoice_small/decode_dev"))
"""

from __future__ import annotations

import json
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from funasr_recipe.core.fmt import pct
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.kaldi_table import TableError, iter_table
from funasr_recipe.data.tags import TAG_KINDS
from funasr_recipe.scoring.error_rate import Counts, align, count, normalize, tokens, unit_for

UNKNOWN_TAGS = frozenset({"emo_unknown", "event_unk"})  # a reference that says "unknown" is not known
TOP_N = 20
LIST_MAX = 50


class ScoreInputError(BadInputError):
    """A malformed input file; the message names the file and line."""


@dataclass
class UttScore:
    key: str
    language: str | None
    unit: str
    status: str  # ok | missing | empty
    primary: Counts
    cer: Counts
    wer: Counts
    alignment: list[tuple[str, str | None, str | None]] = field(default_factory=list)


def read_text(path: Path) -> dict[str, str]:
    """``key text`` lines -> {key: text}; a key alone is an empty text."""
    out: dict[str, str] = {}
    try:
        for rec in iter_table(path):
            if rec.key in out:
                # Found again rather than kept: a line number per key would cost as much as the text.
                first = next(r.lineno for r in iter_table(path) if r.key == rec.key)
                raise ScoreInputError(f"{path}:{rec.lineno}: duplicate key {rec.key!r} "
                                      f"(first on line {first})")
            out[rec.key] = rec.value
    except TableError as e:
        raise ScoreInputError(str(e)) from None
    return out


def _tag(value: str) -> str | None:
    name = value.strip().removeprefix("<|").removesuffix("|>").strip()
    return sys.intern(name) if name else None  # a few distinct tags, each held once


def read_tags(path: Path) -> dict[str, dict[str, str | None]]:
    """A tag TSV with a header naming its columns (``key`` first) -> {key: {column: value or None}}."""
    out: dict[str, dict[str, str | None]] = {}
    with open(path, encoding="utf-8-sig", errors="strict") as f:
        try:
            # Line ends only (str.splitlines would also split a key holding U+2028 or U+0085).
            lines = re.split(r"\r\n|\r|\n", f.read())
        except UnicodeDecodeError as e:
            raise ScoreInputError(f"{path}: not UTF-8 (byte {e.start})") from None
    if not lines or lines[0].split("\t")[0].strip() != "key":
        raise ScoreInputError(f"{path}:1: expected a header line 'key<TAB>language<TAB>...'")
    header = [h.strip() for h in lines[0].split("\t")]
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise ScoreInputError(f"{path}:{lineno}: {len(cells)} fields, the header has {len(header)}")
        key = cells[0].strip()
        if key in out:
            first = next(n for n, x in enumerate(lines[1:], start=2) if x.split("\t")[0].strip() == key)
            raise ScoreInputError(f"{path}:{lineno}: duplicate key {key!r} (first on line {first})")
        out[key] = {h: _tag(c) for h, c in zip(header[1:], cells[1:], strict=True)}
    return out


def read_decode_info(path: Path) -> dict:
    """decode.json as a dict ({} when absent)."""
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ScoreInputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    if not isinstance(info, dict):
        raise ScoreInputError(f"{path}:1: expected a JSON object")
    return info


def score_utterances(refs: dict[str, str], hyps: dict[str, str],
                     ref_tags: dict[str, dict[str, str | None]]) -> Iterator[UttScore]:
    """One UttScore per reference key, sorted by key, made as it is asked for (its alignment is the
    memory: a caller keeps what it needs of it, see Tally)."""
    for key in sorted(refs):
        ref = normalize(refs[key])
        hyp = normalize(hyps.get(key, ""))
        lang = (ref_tags.get(key) or {}).get("language")
        unit = unit_for(lang, ref)
        status = "missing" if key not in hyps else "empty" if not hyp else "ok"
        by_unit = {u: align(tokens(ref, u), tokens(hyp, u)) for u in {"char", "word", unit}}
        yield UttScore(key, lang, unit, status, count(by_unit[unit]), count(by_unit["char"]),
                       count(by_unit["word"]), by_unit[unit])


def tag_accuracy(keys: list[str], ref_tags: dict[str, dict[str, str | None]],
                 hyp_tags: dict[str, dict[str, str | None]]) -> dict[str, dict]:
    """Per tag kind: correct, total and accuracy over utterances whose tags both sides know."""
    if not ref_tags or not hyp_tags:
        return {}
    out = {}
    for kind in TAG_KINDS:
        correct = total = 0
        for key in keys:
            ref = (ref_tags.get(key) or {}).get(kind)
            hyp = (hyp_tags.get(key) or {}).get(kind)
            if ref is None or hyp is None or ref.casefold() in UNKNOWN_TAGS:
                continue
            total += 1
            correct += ref.casefold() == hyp.casefold()
        out[kind] = {"accuracy": correct / total if total else None, "correct": correct, "total": total}
    return out


@dataclass
class Tally:
    """What result.json needs of the scored utterances, added up one utterance at a time, so that no
    alignment outlives its line of per_utt.txt."""

    utterances: int = 0
    cer: Counts = field(default_factory=Counts)
    wer: Counts = field(default_factory=Counts)
    primary: Counts = field(default_factory=Counts)
    languages: dict[str, tuple[int, Counts, frozenset[str]]] = field(default_factory=dict)
    sub: Counter = field(default_factory=Counter)
    ins: Counter = field(default_factory=Counter)
    dele: Counter = field(default_factory=Counter)
    missing: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)

    def add(self, s: UttScore) -> None:
        self.utterances += 1
        self.cer, self.wer, self.primary = self.cer + s.cer, self.wer + s.wer, self.primary + s.primary
        lang = s.language or "unknown"
        n, total, units = self.languages.get(lang, (0, Counts(), frozenset()))
        self.languages[lang] = (n + 1, total + s.primary, units | {s.unit})
        for op, r, h in s.alignment:
            if op == "S":
                self.sub[(r, h)] += 1
            elif op == "I":
                self.ins[h] += 1
            elif op == "D":
                self.dele[r] += 1
        if s.status == "missing":
            self.missing.append(s.key)
        elif s.status == "empty":
            self.empty.append(s.key)

    def top_errors(self) -> dict[str, list]:
        """The most frequent substitutions, insertions and deletions in the primary unit."""
        return {"substitutions": [[r, h, n] for (r, h), n in self.sub.most_common(TOP_N)],
                "insertions": [[t, n] for t, n in self.ins.most_common(TOP_N)],
                "deletions": [[t, n] for t, n in self.dele.most_common(TOP_N)]}

    def per_language(self) -> dict[str, dict]:
        """Primary-unit figures per reference language ("unknown" without one)."""
        return {lang: {"utterances": n, "unit": "+".join(sorted(units)), **total.as_dict()}
                for lang, (n, total, units) in sorted(self.languages.items())}


def summarize(decode_dir: Path, tally: Tally, hyps: dict[str, str], refs: dict[str, str],
              ref_tags: dict, hyp_tags: dict, info: dict) -> dict:
    """The figures of result.json."""
    name = decode_dir.name.removeprefix("decode_")
    pretrained = name.endswith("_pretrained")
    rtf = info.get("rtf")
    if rtf is None and info.get("audio_seconds") and info.get("decode_seconds") is not None:
        rtf = info["decode_seconds"] / info["audio_seconds"]
    return {
        "set": info.get("set") or name.removesuffix("_pretrained"),
        "model": info.get("model") or ("pretrained" if pretrained else decode_dir.parent.name),
        "utterances": tally.utterances,
        "cer": tally.cer.as_dict(), "wer": tally.wer.as_dict(), "primary": tally.primary.as_dict(),
        "per_language": tally.per_language(),
        "tag_accuracy": tag_accuracy(sorted(refs), ref_tags, hyp_tags),
        "top_errors": tally.top_errors(),
        "missing_hyp": tally.missing,
        "empty_hyp": tally.empty,
        "extra_hyp": sorted(set(hyps) - set(refs)),
        "rtf": rtf, "audio_seconds": info.get("audio_seconds"),
        "decode_seconds": info.get("decode_seconds"), "processes": info.get("processes"),
        "device": info.get("device"),
    }


def _width(token: str) -> int:
    # East Asian wide characters take two columns in a terminal: count them so that columns line up.
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in token)


def _pad(token: str, width: int) -> str:
    return token + " " * (width - _width(token))


def _pct(rate: float | None) -> str:
    return pct(rate, missing="inf")


def alignment_lines(alignment: list[tuple[str, str | None, str | None]]) -> list[str]:
    """REF/HYP/EVAL lines, one column per aligned pair; *** on the side that has no token."""
    ref_cells, hyp_cells, eval_cells = [], [], []
    for op, r, h in alignment:
        r, h = r or "***", h or "***"
        w = max(_width(r), _width(h), 1)
        ref_cells.append(_pad(r, w))
        hyp_cells.append(_pad(h, w))
        eval_cells.append(_pad("" if op == "C" else op, w))
    return [f"{tag:<6}{' '.join(cells)}".rstrip() for tag, cells in
            (("REF:", ref_cells), ("HYP:", hyp_cells), ("EVAL:", eval_cells))]


def per_utt_text(s: UttScore) -> str:
    """One utterance's entry of per_utt.txt: its counts, then its aligned REF/HYP/EVAL lines."""
    c = s.primary
    status = "" if s.status == "ok" else f"  hyp={s.status}"
    return (f"{s.key}  lang={s.language or 'unknown'}  unit={s.unit}  #ref={c.n_ref}  "
            f"#C={c.cor} #S={c.sub} #D={c.dele} #I={c.ins}  err={_pct(c.as_dict()['rate'])}{status}\n"
            + "\n".join(alignment_lines(s.alignment)) + "\n\n")


def _keys_line(keys: list[str]) -> str:
    shown = " ".join(keys[:LIST_MAX])
    return shown + (" ..." if len(keys) > LIST_MAX else "")


def result_text(res: dict) -> str:
    """result.txt: the figures of result.json for people."""
    lines = [f"set: {res['set']}", f"model: {res['model']}", f"utterances: {res['utterances']}", "",
             f"{'':<9}{'rate':>9}{'#ref':>9}{'#sub':>8}{'#del':>8}{'#ins':>8}"]
    for name in ("cer", "wer", "primary"):
        c = res[name]
        lines.append(f"{name.upper() if name != 'primary' else 'primary':<9}{_pct(c['rate']):>9}"
                     f"{c['n_ref']:>9}{c['sub']:>8}{c['del']:>8}{c['ins']:>8}")
    lines += ["(CER: characters, WER: words, primary: each utterance in its language's unit)", "",
              "per language (primary unit):",
              f"{'language':<10}{'utts':>6}  {'unit':<11}{'rate':>9}{'#ref':>9}{'#sub':>8}{'#del':>8}"
              f"{'#ins':>8}"]
    for lang, c in res["per_language"].items():
        lines.append(f"{lang:<10}{c['utterances']:>6}  {c['unit']:<11}{_pct(c['rate']):>9}{c['n_ref']:>9}"
                     f"{c['sub']:>8}{c['del']:>8}{c['ins']:>8}")
    lines += ["", "tag accuracy (utterances where reference and hypothesis tags are known):"]
    if not res["tag_accuracy"]:
        lines.append("  - (no ref_tags.tsv or hyp_tags.tsv)")
    for kind, t in res["tag_accuracy"].items():
        acc = pct(t["accuracy"])
        lines.append(f"  {kind:<9}{acc:>8}  ({t['correct']}/{t['total']})")
    top = res["top_errors"]
    lines += ["", f"most frequent substitutions (ref -> hyp), primary unit (top {TOP_N}):"]
    lines += [f"  {n:>6}  {r} -> {h}" for r, h, n in top["substitutions"]] or ["  none"]
    for kind in ("insertions", "deletions"):
        lines += ["", f"most frequent {kind} (top {TOP_N}):"]
        lines += [f"  {n:>6}  {t}" for t, n in top[kind]] or ["  none"]
    lines.append("")
    for label, field_ in (("missing hypotheses (scored as deletions)", "missing_hyp"),
                          ("empty hypotheses (scored as deletions)", "empty_hyp"),
                          ("extra hypothesis keys (no reference, not scored)", "extra_hyp")):
        keys = res[field_]
        lines.append(f"{label}: {len(keys)}" + (f": {_keys_line(keys)}" if keys else ""))
    lines.append("")
    if res["rtf"] is None:
        lines.append("RTF: - (no decode.json)")
    else:
        lines.append(f"RTF: {res['rtf']:.4f} (decode {res['decode_seconds']} s for {res['audio_seconds']} s "
                     f"of audio; {res['processes']} processes on {res['device']})")
    return "\n".join(lines) + "\n"


def score_dir(decode_dir: Path) -> dict:
    """Score a decode dir, write per_utt.txt, result.txt and result.json; return the result."""
    for name in ("ref.txt", "hyp.txt"):
        if not (decode_dir / name).is_file():
            raise ScoreInputError(f"{decode_dir / name}: no such file (has decoding finished?)")
    refs = read_text(decode_dir / "ref.txt")
    hyps = read_text(decode_dir / "hyp.txt")
    tag_files = [decode_dir / "ref_tags.tsv", decode_dir / "hyp_tags.tsv"]
    ref_tags, hyp_tags = (read_tags(p) if p.is_file() else {} for p in tag_files)
    info = read_decode_info(decode_dir / "decode.json")
    tally = Tally()
    with open(decode_dir / "per_utt.txt", "w", encoding="utf-8") as f:
        for s in score_utterances(refs, hyps, ref_tags):
            f.write(per_utt_text(s))
            tally.add(s)
    res = summarize(decode_dir, tally, hyps, refs, ref_tags, hyp_tags, info)
    (decode_dir / "result.txt").write_text(result_text(res), encoding="utf-8")
    (decode_dir / "result.json").write_text(json.dumps(res, ensure_ascii=False, indent=2) + "\n",
                                            encoding="utf-8")
    return res
