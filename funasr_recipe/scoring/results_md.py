"""Collect the scores of an experiment into RESULTS.md, in the style of ESPnet's.

Reads  <exp-dir>/decode_*/result.json (scoring/score.py: decode_<set> for the trained model,
       decode_<set>_pretrained for the model before fine-tuning);
writes <exp-dir>/RESULTS.md (or --out): a header (the exp dir, the config and pretrained model the run
       used and the model it made, as stage 2 recorded them: model/provenance.py; the date of the newest
       score, versions), one table row per (model, set) with CER, WER, the primary error rate and its
       S/D/I, tag accuracies and RTF, then a per-language table for each set that has more than one
       language; with <exp-dir>/regression.json (scoring/regression.py), the regression gate's table.

Rows are sorted by set, and within a set the pretrained model comes first, so the effect of
fine-tuning reads off two adjacent rows.

  write_results_md(Path("exp/sensevoice_small"), Path("exp/sensevoice_small/RESULTS.md"))
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

from funasr_recipe.core.env import versions
from funasr_recipe.core.fmt import pct
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.tags import TAG_KINDS
from funasr_recipe.model.provenance import describe_model_dir, model_label, recipe_record, run_options
from funasr_recipe.scoring.regression import regression_section


def load_results(exp_dir: Path) -> list[tuple[Path, dict]]:
    """(decode dir, result.json) of every scored decode dir, sorted by set, pretrained model first."""
    found = []
    for path in sorted(exp_dir.glob("decode_*/result.json")):
        try:
            res = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise BadInputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
        missing = [k for k in ("set", "model", "utterances", "cer", "wer", "primary") if k not in res]
        if missing:
            raise BadInputError(f"{path}: no {', '.join(missing)}; was it written by scoring/score.py?")
        found.append((path.parent, res))
    return sorted(found, key=lambda dr: (str(dr[1]["set"]), not is_pretrained(dr[0], dr[1]),
                                         str(dr[1]["model"])))


def is_pretrained(decode_dir: Path, res: dict) -> bool:
    """The decode dir of the model before fine-tuning (decode_<set>_pretrained)."""
    return decode_dir.name.endswith("_pretrained") or res.get("model") == "pretrained"


def _pct(rate: float | None) -> str:
    return pct(rate, sign=False)


def _sdi(c: dict) -> str:
    return f"{c['sub']}/{c['del']}/{c['ins']}"


def _acc(res: dict, kind: str) -> str:
    t = (res.get("tag_accuracy") or {}).get(kind)
    return "-" if not t or t.get("accuracy") is None else _pct(t["accuracy"])


def _rtf(res: dict) -> str:
    return "-" if res.get("rtf") is None else f"{res['rtf']:.4f}"


def main_table(results: list[tuple[Path, dict]]) -> list[str]:
    lines = ["| model | set | utts | CER % | WER % | primary % | S/D/I (primary) | language acc % "
             "| emotion acc % | event acc % | RTF |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in results:
        accs = " | ".join(_acc(r, k) for k in TAG_KINDS)
        lines.append(f"| {r['model']} | {r['set']} | {r['utterances']} | {_pct(r['cer']['rate'])} "
                     f"| {_pct(r['wer']['rate'])} | {_pct(r['primary']['rate'])} | {_sdi(r['primary'])} "
                     f"| {accs} | {_rtf(r)} |")
    return lines


def language_tables(results: list[tuple[Path, dict]]) -> list[str]:
    """A per-language table for each set with more than one language."""
    lines: list[str] = []
    for set_name in dict.fromkeys(r["set"] for _, r in results):
        rows = [r for _, r in results if r["set"] == set_name]
        langs = sorted({lang for r in rows for lang in r.get("per_language") or {}})
        if len(langs) < 2:
            continue
        lines += ["", f"### {set_name}: per language", "",
                  "| language | model | utts | unit | error % | S/D/I |", "|---|---|---:|---|---:|---:|"]
        for lang in langs:
            for r in rows:
                c = (r.get("per_language") or {}).get(lang)
                if c:
                    lines.append(f"| {lang} | {r['model']} | {c['utterances']} | {c['unit']} "
                                 f"| {_pct(c['rate'])} | {_sdi(c)} |")
    return lines


def notes(results: list[tuple[Path, dict]]) -> list[str]:
    """Decode dirs whose hypotheses were missing or empty: their rates count them as deletions."""
    out = []
    for decode_dir, r in results:
        missing, empty = len(r.get("missing_hyp") or []), len(r.get("empty_hyp") or [])
        if missing or empty:
            out.append(f"- {decode_dir.name}: {missing} missing and {empty} empty hypotheses, scored as "
                       f"deletions (keys in {decode_dir.name}/result.txt)")
    return ["", *out] if out else []


def run_lines(exp_dir: Path) -> list[str]:
    """The header's account of the run: the exp dir and config as given, the pretrained model, the model
    it made (the final/ model dir's record)."""
    options = run_options(exp_dir)
    lines = [f"- exp dir: {exp_dir}",
             f"- config: {options.get('config', 'not recorded (a run from before train_identity.json)')}"]
    if options.get("pretrained-dir"):
        lines.append(f"- pretrained model: {describe_model_dir(Path(options['pretrained-dir']))}")
    final = exp_dir / "final"
    if recipe_record(final):
        lines.append(f"- model: {model_label(final, Path(options.get('config', 'model')).stem)}")
    return lines


def render(exp_dir: Path, results: list[tuple[Path, dict]], now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now()
    v = versions("torch", "funasr")
    env = (f"python {platform.python_version()}, torch {v['torch']}, "
           f"funasr {v['funasr']}, {platform.system()} {platform.machine()}")
    lines = [f"# RESULTS: {exp_dir}", "", *run_lines(exp_dir),
             f"- date: {now:%Y-%m-%d %H:%M:%S}",
             f"- environment: {env}",
             "- error rates in % after text normalisation (scoring/error_rate.py): CER over characters, "
             "WER over words, primary with each utterance in its language's unit (characters for "
             "zh/yue/ja, words for en/ko, CJK characters and words otherwise); S/D/I: substitutions, "
             "deletions, insertions of the primary unit",
             "- tag accuracy over the utterances whose reference and emitted tags are both known",
             "", "## Error rates", "", *main_table(results), *notes(results), *language_tables(results),
             *regression_section(exp_dir)]
    return "\n".join(lines) + "\n"


def write_results_md(exp_dir: Path, out: Path) -> Path:
    """Write RESULTS.md for every scored decode dir of exp_dir to out; returns out."""
    results = load_results(exp_dir)
    if not results:
        raise FileNotFoundError(f"no {exp_dir}/decode_*/result.json: run local/score.py first (stage 3)")
    # Dated by the newest score, not the clock: a rerun that rescored nothing writes the same bytes, so
    # stage 5 (which fingerprints RESULTS.md) is not redone by a rerun of stage 3 that skipped every set.
    scored = max(path.stat().st_mtime for path in [*(d / "result.json" for d, _ in results),
                                                   *exp_dir.glob("regression.json")])
    out.write_text(render(exp_dir, results, datetime.datetime.fromtimestamp(scored)), encoding="utf-8")
    return out
