"""Forgetting, measured: a bilingual base model fine-tuned on new English speakers four ways.

The case for the fine-tuning safeguards in numbers, on the shared corpora (skips without ../shared):

1. base: a tiny SenseVoice (conf/tiny_sensevoice.yaml) trained from scratch on English digits (FSDD
   speakers george, jackson, theo) and Mandarin syllables (cmn_chenwang, 7 of every 8 clips);
2. each fine-tune starts from base/exp/final and trains on two NEW English speakers only (lucas,
   nicolas: recordings 0-39; 40-49 are the new-data test set), with the same rate and epochs:
   plain; replay of the base's own training data at R = 1 (--replay-dir, --replay-ratio 1); the encoder
   frozen (--freeze encoder); LoRA adapters on the encoder's linear layers (--adapter lora), at the
   config's rate and at LoRA's usual ten times that.
Every fine-tune runs the regression gate on the Mandarin regression set (every 8th cmn_chenwang clip,
never trained on) with --max-regression 1.0, fatal: a row whose command exits 1 failed the gate.

Mandarin transcripts are written as initial, final and tone units ("zhong1" -> "zh ong 1"): with one
recording per syllable a whole-syllable vocabulary (1,707 labels, one example each) cannot be learnt by a
1 M-parameter model in minutes, the units can; error rates on zh are in characters of the pinyin
(scoring/error_rate.py's unit for zh), English in words.

Reads  the bundled FSDD and ../shared/data/mandarin_syllables (or --fsdd-dir/--zh-dir);
writes <work>/corpora/ (the Kaldi dirs), <work>/<row>/ (each row's run.sh data, dump and exp dirs),
       <work>/forgetting.json and <work>/forgetting.md (the table it prints, with each row's command).
A rerun skips what run.sh's own .done markers say is finished, so an interrupted benchmark resumes.

  .venv/bin/python -m bench.bench_forgetting [--work-dir exp/bench_forgetting] [--rows plain,lora]
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
from pathlib import Path

from funasr_recipe.core.cli import program_parser
from funasr_recipe.core.fmt import num as fmt
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.logged_run import run_logged
from funasr_recipe.scoring.across_runs import language_rate as primary
from funasr_recipe.scoring.across_runs import train_seconds
from recipes.common import Utt, read_kaldi_dir, write_kaldi_set
from recipes.fsdd import BUNDLED, NAME, WORDS

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
BASE_EN, NEW_EN = ("george", "jackson", "theo"), ("lucas", "nicolas")
NEW_TEST_FROM = 40  # FSDD recording index: 0-39 of the new speakers train, 40-49 test
ZH_EVERY = 8  # every 8th clip (offset 0) is the regression set, offset 4 the base's dev set
INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r",
            "z", "c", "s", "y", "w")
# The fine-tune every row shares: conf/sensevoice_small.yaml on the base's model dir, as a user
# fine-tunes the released model, with that config's rate (2e-4) and warmup (a tenth of the run), for 6
# epochs of the 800 new utterances; one loader worker per rank on 2 cores.
FINETUNE = ["--", "++dataset_conf.num_workers=1", "++train_conf.max_epoch=6",
            "++train_conf.keep_nbest_models=3", "++train_conf.avg_nbest_model=3"]
ROWS = {"plain": ([], []), "replay": (["--replay-dir", "{corpora}/base/train", "--replay-ratio", "1"], []),
        "freeze": (["--freeze", "encoder"], []),
        "lora": (["--adapter", "lora", "--lora-rank", "8",
                  "--lora-targets", "linear_q_k_v,linear_out,w_1,w_2"], []),
        # LoRA's usual rate: ten times a full fine-tune's, as only 2% of the weights move.
        "lora-lr2e-3": (["--adapter", "lora", "--lora-rank", "8"], ["++optim_conf.lr=0.002"])}


def pinyin_units(syllable: str) -> str:
    """'zhong1' -> 'zh ong 1'; 'a1' -> 'a 1' (no initial)."""
    tone, body = syllable[-1], syllable[:-1]
    if not tone.isdigit() or not body:
        raise ValueError(f"not a toneful pinyin syllable: {syllable!r}")
    initial = next((i for i in INITIALS if body.startswith(i) and len(body) > len(i)), "")
    return " ".join(u for u in (initial, body[len(initial):], tone) if u)


def make_corpora(out: Path, fsdd: Path, zh: Path) -> dict[str, int]:
    """The Kaldi dirs: base/{train,dev}, new/{train,dev}, zh_regress; returns utterances per dir."""
    base_train: list[Utt] = []
    base_dev: list[Utt] = []
    new_train: list[Utt] = []
    new_dev: list[Utt] = []
    for path in sorted((fsdd / "recordings").iterdir()):
        if not (m := NAME.match(path.name)):
            continue
        digit, speaker, index = int(m.group(1)), m.group(2), int(m.group(3))
        utt = Utt(f"{speaker}-{path.stem}", str(path.resolve()), WORDS[digit], speaker, language="en")
        if speaker in BASE_EN:
            (base_dev if index % 10 == 9 else base_train).append(utt)
        elif speaker in NEW_EN:
            (new_dev if index >= NEW_TEST_FROM else new_train).append(utt)
    zh_all = [u for u in read_kaldi_dir(zh / "data" / "all", root=zh) if u.speaker == "cmn_chenwang"]
    regress: list[Utt] = []
    for i, u in enumerate(sorted(zh_all, key=lambda u: u.key)):
        u = Utt(u.key, u.path, pinyin_units(u.text), u.speaker, language="zh")
        [base_train, regress, base_train, base_train, base_dev, base_train, base_train, base_train][
            i % ZH_EVERY].append(u)
    sets = {"base/train": base_train, "base/dev": base_dev, "new/train": new_train, "new/dev": new_dev,
            "zh_regress": regress}
    counts = {}
    for name, utts in sets.items():
        # Written aside, then only the files that changed: stage 0 redoes a set whose files were rewritten
        # (their times changed), and with it every later stage of a rerun.
        fresh = out / ".new" / name
        counts[name] = write_kaldi_set(fresh, utts)
        (out / name).mkdir(parents=True, exist_ok=True)
        for f in fresh.iterdir():
            if not (out / name / f.name).is_file() or (out / name / f.name).read_bytes() != f.read_bytes():
                f.replace(out / name / f.name)
    shutil.rmtree(out / ".new")
    return counts


def vocabulary(train_dir: Path) -> int:
    """Distinct words of a Kaldi dir's transcripts: the word tokenizer's size."""
    words = {w for line in (train_dir / "text").read_text(encoding="utf-8").splitlines()
             for w in line.split()[1:]}
    return len(words)


def run_dirs(work: Path, row: str) -> list[str]:
    return ["--data-dir", str(work / row / "data"), "--dump-dir", str(work / row / "dump"),
            "--exp-dir", str(work / row / "exp")]


def base_command(work: Path, vocab: int, extra: list[str]) -> list[str]:
    return ["./run.sh", "--stage", "0", "--stop-stage", "3", "--corpus", "kaldi",
            "--corpus-dir", str(work / "corpora" / "base"), "--speed-perturb", "1.0", *run_dirs(work, "base"),
            *extra, "--", f"++build_tokenizer.vocab_size={vocab + 8}", "++train_conf.max_epoch=20"]


def row_command(work: Path, row: str, extra: list[str]) -> list[str]:
    corpora = work / "corpora"
    opts, overrides = ROWS[row]
    opts = [a.format(corpora=corpora) for a in opts]
    return ["./run.sh", "--stage", "0", "--stop-stage", "3", "--config", "conf/sensevoice_small.yaml",
            "--corpus", "kaldi", "--corpus-dir", str(corpora / "new"), "--speed-perturb", "1.0",
            *run_dirs(work, row),
            "--pretrained-dir", str(work / "base" / "exp" / "final"),
            "--regression-dir", str(corpora / "zh_regress"), "--max-regression", "1.0", *opts, *extra,
            *FINETUNE, *overrides]


def figures(work: Path, row: str, rc: int, seconds: float, cmd: list[str]) -> dict:
    exp = work / row / "exp"
    return {"row": row, "rc": rc, "seconds": round(seconds, 1), "command": shlex.join(cmd),
            "train_seconds": train_seconds(exp / "train.log"),
            "en_before": primary(exp / "decode_dev_pretrained" / "result.json", "en"),
            "en_after": primary(exp / "decode_dev" / "result.json", "en"),
            "zh_before": primary(exp / "decode_regress_zh_regress_pretrained" / "result.json", "zh"),
            "zh_after": primary(exp / "decode_regress_zh_regress" / "result.json", "zh"),
            "gate": "PASS" if rc == 0 else ("FAIL" if rc == 1 else f"error rc {rc}")}


def table(rows: list[dict]) -> str:
    lines = ["| fine-tune | new English WER % before -> after | Mandarin CER % before -> after | "
             "gate (max +1.0) | training s |", "|---|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['row']} | {fmt(r['en_before'])} -> {fmt(r['en_after'])} | "
                     f"{fmt(r['zh_before'])} -> {fmt(r['zh_after'])} | {r['gate']} | "
                     f"{fmt(r['train_seconds'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--work-dir", type=Path, default=REPO / "exp" / "bench_forgetting")
    parser.add_argument("--fsdd-dir", type=Path, default=BUNDLED)
    parser.add_argument("--zh-dir", type=Path, default=SHARED / "mandarin_syllables")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument("--base-only", action="store_true", help="train the base model and stop")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: the table again from <work>/forgetting.json's runs (their exit "
                             "statuses) and their dirs")
    args, extra = parser.parse_known_args(argv)
    setup_logging()
    if args.report_only:
        work = args.work_dir.resolve()
        runs = json.loads((work / "forgetting.json").read_text(encoding="utf-8"))
        return report(work, [figures(work, r["row"], r["rc"], r["seconds"], shlex.split(r["command"]))
                             for r in runs])
    if not (args.fsdd_dir / "recordings").is_dir() or not (args.zh_dir / "data" / "all").is_dir():
        log.warning("skipped: needs %s and %s (../shared/data)", args.fsdd_dir, args.zh_dir)
        return 0
    work = args.work_dir.resolve()
    counts = make_corpora(work / "corpora", args.fsdd_dir, args.zh_dir)
    log.info("corpora: %s", ", ".join(f"{k} {v}" for k, v in counts.items()))
    cmd = base_command(work, vocabulary(work / "corpora" / "base" / "train"), extra)
    rc, _ = run_logged(cmd, work / "base" / "run.log", REPO)
    if rc != 0:
        log.error("the base model failed (rc %d): see %s", rc, work / "base" / "run.log")
        return 1
    if args.base_only:
        return 0
    rows = []
    for row in [r for r in args.rows.split(",") if r]:
        if row not in ROWS:
            parser.error(f"unknown row {row!r} (have {', '.join(ROWS)})")
        cmd = row_command(work, row, extra)
        rc, seconds = run_logged(cmd, work / row / "run.log", REPO)
        rows.append(figures(work, row, rc, seconds, cmd))
        log.info("%s: %s", row, json.dumps(rows[-1]))
    return report(work, rows)


def report(work: Path, rows: list[dict]) -> int:
    """forgetting.json and forgetting.md, and the table printed."""
    (work / "forgetting.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    text = table(rows) + "\n\nCommands:\n" + "\n".join(f"- {r['row']}: `{r['command']}`" for r in rows)
    (work / "forgetting.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
