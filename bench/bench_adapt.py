"""Fine-tuning to a new speaker, measured over every bundled speaker: does the recipe's default
fine-tune help the speaker without hurting the others?

For each FSDD speaker S (default: all five bundled ones):

1. base: the leave-one-speaker-out fold of bench_loso.py that never heard S (trained on the other four,
   checkpoints chosen on a tenth of them), run or reused from --loso-dir;
2. S's own data, as a user brings it (a Kaldi dir): train = S's first N recordings of every digit
   (recording index < N / 10), dev = indices 15-19 (50), test = indices 20-49 (300); dev and test are the
   same for every N, so the sizes compare;
3. the fine-tune, as a user runs it: ``run.sh --config conf/sensevoice_small.yaml --pretrained-dir
   <base>/exp/final``, with the base's dev set as ``--regression-dir`` (never trained on), so that run.sh
   replays the base's training set by default (--no-replay: ``--replay-dir none``), and nothing else
   but ``++dataset_conf.num_workers=1`` (2 cores) and the seed; options and overrides after ``--`` are
   added to every fine-tune (a variant; --label names its rows).

Per speaker and N it prints the base model's WER on S's test set (stage 3's decode of the pretrained
model), the fine-tuned one's, the relative reduction, the regression on the other speakers in points
(fine-tuned minus base, on the base's dev set) and stage 2's time; then the mean per N over speakers.

Reads  the bundled FSDD (or --corpus-dir) and each fold's run;
writes <work>/corpora/<S>/N<n>/ (the Kaldi dirs), <work>/<label>/<S>/N<n>/s<seed>/ (each fine-tune's
       data, dump and exp), <work>/<label>/adapt.json and adapt.md (the table it prints).
A rerun reads back each scored fine-tune (its cell.json; the checkpoints are gone) and skips what run.sh's
own .done markers say is finished, so an interrupted benchmark resumes.

  .venv/bin/python -m bench.bench_adapt [--work-dir adapt] [--loso-dir loso] [--sizes 50,150] \\
      [--seeds 0] [--speakers george,theo] [--label default] [-- --replay-ratio 2 ++optim_conf.lr=0.001]
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser, split_overrides
from funasr_recipe.core.fmt import num as fmt
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.logged_run import run_logged
from funasr_recipe.model.model_dir import recorded_training_data
from funasr_recipe.scoring.across_runs import language_rate, train_seconds
from recipes.common import Utt, split_list, write_kaldi_set
from recipes.fsdd import BUNDLED, NAME, WORDS, speakers

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
DEV_TAKES, TEST_FROM = range(15, 20), 20  # recording indices of S's dev and test sets
CONFIG = "conf/sensevoice_small.yaml"
CPU_ONLY = ["++dataset_conf.num_workers=1"]  # one loader worker per rank on 2 cores


def speaker_sets(corpus_dir: Path, speaker: str, n: int) -> dict[str, list[Utt]]:
    """S's train (first ``n`` recordings, the same takes of every digit), dev and test sets."""
    if n % 10 or not 0 < n <= 10 * DEV_TAKES.start:
        raise ValueError(f"N={n}: a multiple of 10 up to {10 * DEV_TAKES.start} (every digit alike)")
    sets: dict[str, list[Utt]] = {"train": [], "dev": [], "test": []}
    for path in sorted((corpus_dir / "recordings").iterdir()):
        m = NAME.match(path.name)
        if not m or m.group(2) != speaker:
            continue
        index = int(m.group(3))
        utt = Utt(f"{speaker}-{path.stem}", str(path.resolve()), WORDS[int(m.group(1))], speaker,
                  language="en")
        if index < n // 10:
            sets["train"].append(utt)
        elif index in DEV_TAKES or index >= TEST_FROM:
            sets["dev" if index in DEV_TAKES else "test"].append(utt)
    return sets


def write_corpus(out: Path, sets: dict[str, list[Utt]]) -> None:
    """The Kaldi dirs, rewriting only files whose content changed: stage 0 redoes a set whose files are
    newer, and with it every later stage of a rerun."""
    for name, utts in sets.items():
        fresh = out / ".new" / name
        write_kaldi_set(fresh, utts)
        (out / name).mkdir(parents=True, exist_ok=True)
        for f in fresh.iterdir():
            if not (out / name / f.name).is_file() or (out / name / f.name).read_bytes() != f.read_bytes():
                f.replace(out / name / f.name)
    shutil.rmtree(out / ".new")


def variant_args(extra: list[str]) -> tuple[list[str], list[str]]:
    """(run.sh options, overrides) of what follows the bench's ``--``: options first, then the
    overrides, after a second ``--`` or from the first argument that starts with "+"."""
    if "--" in extra:
        return split_overrides(extra)
    first = next((i for i, a in enumerate(extra) if a.startswith("+")), len(extra))
    return extra[:first], extra[first:]


def finetune_command(run_dir: Path, corpus: Path, fold: Path, seed: int, extra: list[str],
                     replay: bool = True) -> list[str]:
    """run.sh stages 0-3 of one fine-tune; ``extra``: run.sh options, then overrides (variant_args);
    ``replay``: the base's training set replayed, by run.sh's default where the base's model dir records
    that set (stage 3 of a fold since it does), else by --replay-dir; without, --replay-dir none."""
    opts, overrides = variant_args(extra)
    if not replay:
        replayed = ["--replay-dir", "none"]
    elif recorded_training_data(fold / "exp" / "final") == (fold / "data" / "train").resolve():
        replayed = []
    else:
        replayed = ["--replay-dir", str(fold / "data" / "train")]
    return ["./run.sh", "--stage", "0", "--stop-stage", "3", "--config", CONFIG, "--corpus", "kaldi",
            "--corpus-dir", str(corpus), "--data-dir", str(run_dir / "data"),
            "--dump-dir", str(run_dir / "dump"), "--exp-dir", str(run_dir / "exp"),
            "--pretrained-dir", str(fold / "exp" / "final"),
            "--regression-dir", str(fold / "data" / "dev"), *replayed, *opts,
            "--", *CPU_ONLY, f"++seed={seed}", *overrides]


def cell(run_dir: Path, speaker: str, n: int, seed: int, rc: int) -> dict:
    """One fine-tune's figures from its exp dir (error rates in %, None where a decode is missing)."""
    exp = run_dir / "exp"
    base, tuned = language_rate(exp / "decode_test_pretrained" / "result.json", "en"), \
        language_rate(exp / "decode_test" / "result.json", "en")
    reg_base, reg_tuned = language_rate(exp / "decode_regress_dev_pretrained" / "result.json", "en"), \
        language_rate(exp / "decode_regress_dev" / "result.json", "en")
    return {"speaker": speaker, "n": n, "seed": seed, "rc": rc, "base_wer": base, "wer": tuned,
            "relative_reduction": None if base in (None, 0) or tuned is None else (base - tuned) / base,
            "regression_base": reg_base, "regression_wer": reg_tuned,
            "regression_points": None if reg_base is None or reg_tuned is None else reg_tuned - reg_base,
            "train_seconds": train_seconds(exp / "train.log")}


def scored_cell(cmd: list[str], run_dir: Path, speaker: str, n: int, seed: int) -> dict:
    """One fine-tune's figures: read back from ``<run_dir>/cell.json`` when an earlier run of the bench
    scored it, else ``cmd`` is run and scored; a finished fine-tune's checkpoints are then deleted (about
    650 MB each: the bench's sixty-odd fine-tunes filled an 80 GB disk), keeping final/, decodes and logs."""
    saved = run_dir / "cell.json"
    if saved.is_file():
        return json.loads(saved.read_text(encoding="utf-8"))
    rc, _ = run_logged(cmd, run_dir / "run.log", REPO)
    figures = cell(run_dir, speaker, n, seed, rc)
    if rc == 0:
        saved.write_text(json.dumps(figures) + "\n", encoding="utf-8")
        for ckpt in (run_dir / "exp").glob("model.pt*"):  # per epoch, latest, best (DeepSpeed: dirs)
            shutil.rmtree(ckpt) if ckpt.is_dir() else ckpt.unlink()
    return figures


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def summary(cells: list[dict]) -> list[dict]:
    """Per N: the means over speakers (of each speaker's mean over seeds), the spread over seeds, and
    how many speakers improved."""
    rows = []
    for n in sorted({c["n"] for c in cells}):
        per_speaker = {}
        for c in (c for c in cells if c["n"] == n):
            per_speaker.setdefault(c["speaker"], []).append(c)
        means = {s: {k: _mean([c[k] for c in cs]) for k in ("base_wer", "wer", "relative_reduction",
                                                             "regression_points", "train_seconds")}
                 for s, cs in per_speaker.items()}
        seeds = sorted({c["seed"] for c in cells if c["n"] == n})
        by_seed = [_mean([c["relative_reduction"] for c in cells if c["n"] == n and c["seed"] == s])
                   for s in seeds]
        rows.append({"n": n, "speakers": len(means), "seeds": seeds,
                     **{k: _mean([m[k] for m in means.values()]) for k in next(iter(means.values()))},
                     "improved": sum(1 for m in means.values() if m["relative_reduction"] is not None
                                     and m["relative_reduction"] > 0),
                     "worst_regression": max((m["regression_points"] for m in means.values()
                                              if m["regression_points"] is not None), default=None),
                     "reduction_by_seed": by_seed})
    return rows


def table(cells: list[dict], label: str) -> str:
    pct = lambda x: fmt(None if x is None else 100 * x)  # noqa: E731
    lines = [f"Fine-tuning to a new speaker ({label}): WER % on the speaker's 300 test recordings, "
             "regression in points on the other four speakers' 200 dev recordings", "",
             "| speaker | N | seed | base WER | fine-tuned WER | relative reduction % | regression points | "
             "training s | exit |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cells:
        lines.append(f"| {c['speaker']} | {c['n']} | {c['seed']} | {fmt(c['base_wer'])} | {fmt(c['wer'])} | "
                     f"{pct(c['relative_reduction'])} | {fmt(c['regression_points'])} | "
                     f"{fmt(c['train_seconds'], 0)} | {c['rc']} |")
    lines += ["", "| N | speakers | seeds | mean base WER | mean fine-tuned WER | "
              "mean relative reduction % | improved | mean / worst regression points | reduction % by seed | "
              "mean training s |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in summary(cells):
        lines.append(f"| {r['n']} | {r['speakers']} | {','.join(map(str, r['seeds']))} | "
                     f"{fmt(r['base_wer'])} | {fmt(r['wer'])} | {pct(r['relative_reduction'])} | "
                     f"{r['improved']}/{r['speakers']} | "
                     f"{fmt(r['regression_points'])} / {fmt(r['worst_regression'])} | "
                     f"{' '.join(pct(x) for x in r['reduction_by_seed'])} | {fmt(r['train_seconds'], 0)} |")
    return "\n".join(lines) + "\n"


def ensure_fold(loso: Path, speaker: str, corpus_dir: Path) -> Path:
    """The base model that never heard ``speaker``: bench_loso.py's fold, run (or resumed) when missing."""
    fold = loso / speaker
    if not (fold / "exp" / "final" / ".done").is_file():
        cmd = [sys.executable, "-m", "bench.bench_loso", "--work-dir", str(loso),
               "--corpus-dir", str(corpus_dir), "--speakers", speaker]
        rc, _ = run_logged(cmd, loso / f"bench_loso_{speaker}.log", REPO)
        if rc != 0:
            raise RuntimeError(f"the base fold of {speaker} failed (exit {rc}): see {loso}/{speaker}.log")
    return fold


def main(argv: list[str] | None = None) -> int:
    own, extra = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = program_parser(__doc__)
    parser.add_argument("--work-dir", type=Path, default=Path("adapt"))
    parser.add_argument("--loso-dir", type=Path, default=Path("loso"), help="bench_loso.py's work dir")
    parser.add_argument("--corpus-dir", type=Path, default=BUNDLED, help="FSDD in its upstream layout")
    parser.add_argument("--speakers", default="", help="comma separated (default: every speaker)")
    parser.add_argument("--sizes", default="50,150", help="training recordings of the new speaker")
    parser.add_argument("--seeds", default="0", help="fine-tuning seeds (++seed)")
    parser.add_argument("--label", default="default", help="the variant's name: its rows' folder")
    parser.add_argument("--no-replay", action="store_true", help="no --replay-dir (the base's training set)")
    args = parser.parse_args(own)
    setup_logging()
    work, loso, corpus_dir = args.work_dir.resolve(), args.loso_dir.resolve(), args.corpus_dir.resolve()
    chosen = split_list(args.speakers) or speakers(corpus_dir)
    sizes, seeds = [int(x) for x in split_list(args.sizes)], [int(x) for x in split_list(args.seeds)]
    cells = []
    for speaker in chosen:
        fold = ensure_fold(loso, speaker, corpus_dir)
        for n in sizes:
            corpus = work / "corpora" / speaker / f"N{n}"
            write_corpus(corpus, speaker_sets(corpus_dir, speaker, n))
            for seed in seeds:
                run_dir = work / args.label / speaker / f"N{n}" / f"s{seed}"
                cmd = finetune_command(run_dir, corpus, fold, seed, extra, not args.no_replay)
                cells.append(scored_cell(cmd, run_dir, speaker, n, seed))
                log.info("%s N=%d seed %d: %s", speaker, n, seed, json.dumps(cells[-1]))
    text = table(cells, args.label)
    out = work / args.label
    report = {"label": args.label, "extra": extra, "cells": cells, "summary": summary(cells)}
    (out / "adapt.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "adapt.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
