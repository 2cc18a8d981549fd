"""The regression gate of a fine-tune: sets that must not get worse, before and after, PASS or FAIL.

Reads  <model-dir>/{config.yaml,configuration.json} and the tokenizer files they name (no weights), and a
       regression set's data.jsonl (``target``, ``text_language``), for ``check_language``;
       <exp-dir>/decode_<set>_pretrained/result.json (the model before fine-tuning) and
       <exp-dir>/decode_<set>/result.json (after), as scoring/score.py writes them, for the gate;
writes <exp-dir>/regression.json (every row's figures and the verdict) and <exp-dir>/regression.md (the
       table); ``regression_section`` renders the table into RESULTS.md (scoring/results_md.py).

A regression set is scored in the primary unit of each utterance's language, overall and per language.
Each row compares the two models: delta = after - before in absolute error-rate points, PASS when
delta <= the limit. The rates are computed as exact fractions of the counts, so that a delta of exactly
the limit passes (100 * (4/100 - 3/100) is 1.0000000000000002 in floating point). A set with more than one
language gets an ``all`` row too; any FAIL fails the gate.

``check_language`` refuses a set the model cannot be judged on: a SenseVoice model must know each
language tag (one token of its tokenizer, a row of its language table), and for every family, most of a
language's transcript characters must not be unknown to the tokenizer (the model could not emit them).

  check_language(Path("exp/x/pretrained"), Path("data/regress_zh/data.jsonl"))
  report = gate(load_pairs(Path("exp/x"), ["regress_zh"]), max_regression=1.0)
  write_report(Path("exp/x"), report)
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from funasr_recipe.core.files import write_atomic
from funasr_recipe.core.fmt import pct
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.data.tags import TAG_FIELDS, bare_tag
from funasr_recipe.families.registry import FAMILIES, FamilySpec
from funasr_recipe.features.targets import load_tokenizer

MAX_UNK_SHARE = 0.5  # of a language's transcript characters (whitespace aside)
N_EXAMPLES = 5
ALL = "all"  # the row of a whole set with more than one language
REPORT_JSON, REPORT_MD = "regression.json", "regression.md"


# --- the language check --------------------------------------------------------------------------------

def model_config(model_dir: Path) -> dict:
    """A model dir's config.yaml with its tokenizer files resolved as funasr's AutoModel resolves them:
    configuration.json's file_path_metas and relative names are files of the dir."""
    path = model_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; --model-dir must be a model dir in the hub's layout")
    cfg: dict = OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[assignment]
    conf = dict(cfg.get("tokenizer_conf") or {})
    meta_path = model_dir / "configuration.json"
    if meta_path.is_file():
        metas = json.loads(meta_path.read_text(encoding="utf-8")).get("file_path_metas") or {}
        conf.update(metas.get("tokenizer_conf") or {})
    for key, value in conf.items():
        if isinstance(value, str) and not Path(value).is_absolute() and (model_dir / value).exists():
            conf[key] = str(model_dir / value)
    cfg["tokenizer_conf"] = conf
    return cfg


def unknown_surfaces(tokenizer: Any, text: str) -> list[str]:
    """The stretches of ``text`` that ``tokenizer`` encodes as its unknown token."""
    sp = getattr(tokenizer, "sp", None)
    if sp is not None:  # sentencepiece: one <unk> piece may cover several unknown words
        unk = sp.unk_id()
        return [p.surface for p in sp.encode(text, return_type="proto").pieces if p.id == unk]
    if hasattr(tokenizer, "unk_id") and hasattr(tokenizer, "tokens2ids"):  # a token list (CharTokenizer)
        tokens = tokenizer.text2tokens(text)
        return [t for t, i in zip(tokens, tokenizer.tokens2ids(tokens), strict=True) if i == tokenizer.unk_id]
    raise BadInputError(f"tokenizer {type(tokenizer).__name__}: cannot tell its unknown tokens; the "
                        "regression check knows sentencepiece and token-list tokenizers")


def _chars(text: str) -> int:
    return sum(not c.isspace() for c in text)


def _check_tags(tokenizer: Any, languages: Counter, where: str, spec: FamilySpec) -> None:
    lid_dict, lid_int_dict = spec.language_ids, spec.language_token_ids
    for lang, n in languages.items():
        if lang == "unknown":
            continue  # no tag: SenseVoice decodes with language "auto"
        tag = f"<|{lang}|>"
        if lang not in lid_dict:
            raise BadInputError(f"{where}: {n} utterances in language {tag}, which {spec.name} does not "
                                f"know (its languages: {', '.join(lid_dict)}); drop the set or use a model "
                                "that knows the language")
        ids = tokenizer.encode(tag)
        if len(ids) != 1 or ids[0] not in lid_int_dict:
            raise BadInputError(f"{where}: language tag {tag} ({n} utterances) encodes to {ids} with the "
                                f"model's tokenizer ({type(tokenizer).__name__}), not to one of the language "
                                f"ids {spec.name} maps ({sorted(lid_int_dict)}); is this the model's "
                                "tokenizer?")


def check_language(model_dir: Path, data_jsonl: Path, max_unk_share: float = MAX_UNK_SHARE) -> dict:
    """Raise ValueError naming the set, its language and why, when the model in ``model_dir`` does not
    know the language of the regression set ``data_jsonl``; returns {language: {utterances,
    unk_share}} of a set it knows."""
    import funasr_recipe.model.sensevoice_tokenizer  # noqa: F401  (registers SenseVoiceTagTokenizer)

    cfg = model_config(model_dir)
    tokenizer = load_tokenizer(cfg)
    where = f"regression set {data_jsonl}"
    utts: Counter = Counter()
    chars: Counter = Counter()
    unk_chars: Counter = Counter()
    examples: dict[str, Counter] = {}
    for lineno, obj in iter_jsonl(data_jsonl):
        target = obj.get("target")
        if not isinstance(target, str):
            raise BadInputError(f"{data_jsonl}:{lineno}: no string 'target' field")
        lang = bare_tag(obj.get(TAG_FIELDS["language"])) or "unknown"
        utts[lang] += 1
        chars[lang] += _chars(target)
        unknown = [s.strip() for s in unknown_surfaces(tokenizer, target)]
        unk_chars[lang] += sum(map(_chars, unknown))
        examples.setdefault(lang, Counter()).update(s for s in unknown if s)
    if not utts:
        raise BadInputError(f"{where}: no utterances")
    spec = FAMILIES.get(cfg.get("model"))
    if spec is not None and spec.language_ids:  # a family with a language prompt: its tags must encode
        _check_tags(tokenizer, utts, where, spec)
    shares = {lang: {"utterances": utts[lang], "unk_share": unk_chars[lang] / chars[lang] if chars[lang]
                     else 0.0} for lang in sorted(utts)}
    for lang, s in shares.items():
        if s["unk_share"] > max_unk_share:
            shown = ", ".join(repr(w) for w, _ in examples[lang].most_common(N_EXAMPLES))
            raise BadInputError(f"{where}: language {lang} ({s['utterances']} utterances): "
                                f"{s['unk_share']:.0%} of its transcript characters are unknown (<unk>) to "
                                f"the tokenizer of {model_dir} (limit {max_unk_share:.0%}), e.g. {shown}: "
                                "the model does not know this language, so a regression on it cannot be "
                                "measured")
    return shares


# --- the gate ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One set (and language) of the gate: primary error rates before and after, as exact fractions."""

    set: str
    language: str
    unit: str
    utterances: int
    before: Fraction
    after: Fraction
    limit: Fraction  # absolute points

    @property
    def delta(self) -> Fraction:
        """after - before, in absolute error-rate points."""
        return 100 * (self.after - self.before)

    @property
    def passed(self) -> bool:
        return self.delta <= self.limit

    def as_dict(self) -> dict:
        return {"set": self.set, "language": self.language, "unit": self.unit, "utterances": self.utterances,
                "before": float(self.before), "after": float(self.after), "delta_points": float(self.delta),
                "limit_points": float(self.limit), "verdict": "PASS" if self.passed else "FAIL"}


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    max_regression: float
    models: dict[str, dict[str, str]]  # set -> {"before": model, "after": model}

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.passed]

    def as_dict(self) -> dict:
        return {"max_regression_points": self.max_regression, "verdict": "PASS" if self.passed else "FAIL",
                "failed_sets": sorted({r.set for r in self.failures}), "models": self.models,
                "rows": [r.as_dict() for r in self.rows]}


def load_pairs(exp_dir: Path, sets: Sequence[str]) -> list[tuple[str, dict, dict]]:
    """(set, pretrained result.json, fine-tuned result.json) of each regression set of ``exp_dir``."""
    if not sets:
        raise BadInputError("no regression sets given")
    pairs = []
    for name in sets:
        results = []
        for suffix, what in (("_pretrained", "the pretrained model"), ("", "the fine-tuned model")):
            path = exp_dir / f"decode_{name}{suffix}" / "result.json"
            if not path.is_file():
                need = (" The gate compares the model before fine-tuning with the model after: it needs a "
                        "fine-tune (--pretrained-dir, or a config with pretrained_model); a from-scratch run "
                        "has no model to compare with." if suffix else " Has stage 3 decoded and scored it?")
                raise FileNotFoundError(f"{path}: no such file (regression set {name} decoded with {what})."
                                        f"{need}")
            try:
                results.append(json.loads(path.read_text(encoding="utf-8")))
            except json.JSONDecodeError as e:
                raise BadInputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
        pairs.append((name, results[0], results[1]))
    return pairs


def _rate(counts: dict, where: str) -> Fraction:
    try:
        n_ref, errors = counts["n_ref"], counts["sub"] + counts["del"] + counts["ins"]
    except (KeyError, TypeError):
        raise BadInputError(f"{where}: no primary counts (n_ref, sub, del, ins); was it written by "
                            "scoring/score.py?") from None
    if not n_ref:
        raise BadInputError(f"{where}: no reference tokens, so no error rate to compare")
    return Fraction(errors, n_ref)


def _row(name: str, language: str, before: dict, after: dict, limit: Fraction) -> Row:
    where = f"regression set {name}, language {language}"
    for field in ("utterances", "n_ref"):
        if before.get(field) != after.get(field):
            raise BadInputError(f"{where}: {field} {before.get(field)} before fine-tuning but "
                                f"{after.get(field)} after: the two decode dirs are not of the same data; "
                                "rerun stage 3")
    return Row(name, language, str(after.get("unit") or "-"), int(after["utterances"]),
               _rate(before, f"{where} (pretrained)"), _rate(after, f"{where} (fine-tuned)"), limit)


def gate(pairs: Sequence[tuple[str, dict, dict]], max_regression: float) -> Report:
    """Rows for each (set, result before, result after): one per language, plus ``all`` for a set with
    several; PASS where the primary error rate rose by at most ``max_regression`` points."""
    if not math.isfinite(max_regression):
        raise BadInputError(f"--max-regression {max_regression}: expected a number of error-rate points")
    limit = Fraction(str(max_regression))
    rows: list[Row] = []
    models = {}
    for name, before, after in pairs:
        langs_b, langs_a = before.get("per_language") or {}, after.get("per_language") or {}
        if set(langs_b) != set(langs_a):
            raise BadInputError(f"regression set {name}: languages {sorted(langs_b)} before fine-tuning but "
                                f"{sorted(langs_a)} after: the decode dirs are not of the same data; rerun "
                                "stage 3")
        if len(langs_a) != 1:
            units = "+".join(sorted({c.get("unit", "-") for c in langs_a.values()})) or "-"
            total_b = {**before.get("primary", {}), "utterances": before.get("utterances"), "unit": units}
            total_a = {**after.get("primary", {}), "utterances": after.get("utterances"), "unit": units}
            rows.append(_row(name, ALL, total_b, total_a, limit))
        rows += [_row(name, lang, langs_b[lang], langs_a[lang], limit) for lang in sorted(langs_a)]
        models[name] = {"before": str(before.get("model")), "after": str(after.get("model"))}
    return Report(rows, max_regression, models)


# --- reports -------------------------------------------------------------------------------------------

def _points(value: float) -> str:
    return f"{value:+.2f}"


def table(doc: dict) -> list[str]:
    """The markdown table of a regression.json (``Report.as_dict``)."""
    lines = ["| set | language | unit | utts | before % | after % | delta (points) | limit (points) "
             "| result |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['set']} | {r['language']} | {r['unit']} | {r['utterances']} "
                     f"| {pct(r['before'], sign=False)} | {pct(r['after'], sign=False)} "
                     f"| {_points(r['delta_points'])} | {_points(r['limit_points'])} | {r['verdict']} |")
    return lines


def failure_message(doc: dict) -> str:
    """One line naming each failing row of a regression.json and its figures."""
    fails = [f"{r['set']} ({r['language']}, {r['unit']}): {pct(r['before'])} -> {pct(r['after'])}, "
             f"{_points(r['delta_points'])} points" for r in doc["rows"] if r["verdict"] == "FAIL"]
    return (f"regression gate FAILED on {', '.join(doc['failed_sets'])}: error rate rose by more than "
            f"{doc['max_regression_points']:g} points: {'; '.join(fails)}")


def write_report(exp_dir: Path, report: Report) -> dict:
    """Write <exp-dir>/regression.json and regression.md; returns the JSON's content."""
    doc = report.as_dict()
    write_atomic(exp_dir / REPORT_JSON, json.dumps(doc, ensure_ascii=False, indent=2) + "\n")
    write_atomic(exp_dir / REPORT_MD, "\n".join(table(doc)) + "\n")
    return doc


def regression_section(exp_dir: Path) -> list[str]:
    """RESULTS.md's "Regression gate" section, from <exp-dir>/regression.json; [] without one."""
    path = exp_dir / REPORT_JSON
    if not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadInputError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    models = "; ".join(f"{s}: {m['before']} -> {m['after']}" for s, m in doc.get("models", {}).items())
    return ["", "## Regression gate", "",
            f"- verdict: **{doc['verdict']}** (primary error rate before and after fine-tuning; FAIL where "
            f"it rose by more than {doc['max_regression_points']:g} percentage points)",
            f"- models: {models}", "", *table(doc)]
