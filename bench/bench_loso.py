"""Leave-one-speaker-out error rates of a config on the digit corpus: how well it does on a voice it
never heard, for every speaker, not only the dev speaker the config was tuned on.

For each speaker S of the corpus (default: all five bundled speakers) it runs, from the repo root,

  ./run.sh --stage 0 --stop-stage 3 --config <config> --prep-opts "--dev-speakers none --test-speakers S" \\
      --data-dir <work>/S/data --dump-dir <work>/S/dump --exp-dir <work>/S/exp [run.sh options after --]

so S is the test set, and neither trains nor chooses checkpoints: the dev set that selects and averages
checkpoints by validation loss is a tenth of the other four speakers' recordings (recipes/fsdd), and
the other nine tenths train. The config is unchanged: these figures say how far the demo's dev-speaker
figure (README) generalises.

Reads  <work>/S/exp/decode_test/result.json (stage 3) of every fold;
writes <work>/S/ (each fold's run), <work>/loso.json (every fold's figures, mean and pooled) and
       <work>/loso.md (the table it prints).
A rerun skips what run.sh's own .done markers say is finished, so an interrupted benchmark resumes.

  .venv/bin/python -m bench.bench_loso [--work-dir loso] [--config conf/tiny_sensevoice.yaml] \\
      [--speakers george,jackson] [-- --nproc-per-node 2]
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from funasr_recipe.core.cli import program_parser, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.scoring.across_runs import mean_rate, pooled_rate, run_row
from recipes.common import split_list
from recipes.fsdd import BUNDLED
from recipes.fsdd import speakers as corpus_speakers

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]


def fold_command(speaker: str, work: Path, config: str, corpus_dir: Path, extra: list[str]) -> list[str]:
    """run.sh stages 0-3 of the fold that tests on ``speaker``."""
    fold = work / speaker
    return ["./run.sh", "--stage", "0", "--stop-stage", "3", "--config", config, "--corpus", "fsdd",
            "--corpus-dir", str(corpus_dir), "--prep-opts", f"--dev-speakers none --test-speakers {speaker}",
            "--data-dir", str(fold / "data"), "--dump-dir", str(fold / "dump"),
            "--exp-dir", str(fold / "exp"),
            *extra]


def fold_result(speaker: str, result_json: Path, seconds: float) -> dict:
    """One table row from a fold's decode_test/result.json."""
    return {"speaker": speaker, **run_row(result_json), "seconds": seconds}


def table(rows: list[dict], config: str) -> str:
    """The markdown table of every fold, their mean and the pooled rate."""
    lines = [f"Leave-one-speaker-out, {config} (test speaker unseen in training and checkpoint choice)", "",
             "| test speaker | utts | CER % | WER % | missing/empty hyp | fold time |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['speaker']} | {r['utterances']} | {100 * r['cer']['rate']:.2f} | "
                     f"{100 * r['wer']['rate']:.2f} | {r['missing_or_empty']} | "
                     f"{r['seconds'] / 60:.1f} min |")
    if rows:
        lines.append(f"| mean of {len(rows)} folds | {sum(r['utterances'] for r in rows)} | "
                     f"{100 * mean_rate(rows, 'cer'):.2f} | {100 * mean_rate(rows, 'wer'):.2f} | | |")
        lines.append(f"| pooled | | {100 * pooled_rate(rows, 'cer'):.2f} | "
                     f"{100 * pooled_rate(rows, 'wer'):.2f} | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    own, extra = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = program_parser(__doc__)
    parser.add_argument("--work-dir", type=Path, default=Path("loso"),
                        help="folds go to <work-dir>/<speaker>/")
    parser.add_argument("--config", default="conf/tiny_sensevoice.yaml")
    parser.add_argument("--corpus-dir", type=Path, default=BUNDLED, help="FSDD in its upstream layout")
    parser.add_argument("--speakers", default="",
                        help="comma separated (default: every speaker of the corpus)")
    args = parser.parse_args(own)
    setup_logging()
    speakers = split_list(args.speakers) or corpus_speakers(args.corpus_dir)
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, speaker in enumerate(speakers):
        cmd = fold_command(speaker, work, args.config, args.corpus_dir.resolve(), extra)
        fold_log = work / f"{speaker}.log"
        log.info("fold %d/%d: test speaker %s (log: %s)", i + 1, len(speakers), speaker, fold_log)
        start = time.monotonic()
        with open(fold_log, "a", encoding="utf-8") as out:
            rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            log.error("fold %s failed (exit %d): %s; see %s", speaker, rc, " ".join(cmd), fold_log)
            return 1
        row = fold_result(speaker, work / speaker / "exp" / "decode_test" / "result.json",
                          time.monotonic() - start)
        log.info("fold %s: WER %.2f%% CER %.2f%% on %d utterances (%.1f min)", speaker,
                 100 * row["wer"]["rate"], 100 * row["cer"]["rate"], row["utterances"], row["seconds"] / 60)
        rows.append(row)
    text = table(rows, args.config)
    (work / "loso.md").write_text(text, encoding="utf-8")
    summary = {"config": args.config, "folds": rows,
               "mean_wer": mean_rate(rows, "wer"),
               "pooled_wer": pooled_rate(rows, "wer"), "pooled_cer": pooled_rate(rows, "cer")}
    (work / "loso.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
