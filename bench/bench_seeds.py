"""The demo config's dev error rate over several training seeds: the spread one ./run.sh figure sits in.

A 4.4 M-parameter model trained from scratch on 2,000 clips ends several WER points apart when only its
seed changes, so one run cannot say whether a config change helped. This runs, from the repo root,

  ./run.sh --stage 0 --stop-stage 1 --config <config> --data-dir <work>/data --dump-dir <work>/dump \
      [-- overrides]
  ./run.sh --stage 2 --stop-stage 3 --config <config> ... --exp-dir <work>/seed<N> -- ++seed=<N> [overrides]

(stages 0-1 once: the features do not depend on the seed; the overrides go to both, as stage 1 reads the
config too: ``++feats_storage=uint16`` decides how it stores the features), then prints each seed's dev
CER and WER, its best and last validation loss (the training curve, from <exp>/curves.tsv), their mean
and range.

Reads  <work>/seed<N>/decode_dev/result.json and <work>/seed<N>/curves.tsv;
writes <work>/ (the runs), <work>/seeds.json and <work>/seeds.md (the table it prints).
A rerun skips what run.sh's own .done markers say is finished, so an interrupted benchmark resumes.

  .venv/bin/python -m bench.bench_seeds [--work-dir seeds] [--seeds 0,1,2] \\
      [--config conf/tiny_sensevoice.yaml] [-- ++scheduler=warmup_cosine]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from funasr_recipe.core.cli import program_parser, run_main, split_overrides
from funasr_recipe.core.log import setup_logging
from funasr_recipe.reports.curves import read_validation_losses
from funasr_recipe.scoring.across_runs import mean_rate, run_row
from recipes.common import split_list

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]


def seed_commands(work: Path, config: str, seed: int, overrides: list[str]) -> list[list[str]]:
    """run.sh's stages 0-1 (shared by every seed, skipped once done) and the seed's stages 2-3; the
    overrides go to both (stage 1 reads the frontend and ``feats_storage`` from the config)."""
    dirs = ["--config", config, "--data-dir", str(work / "data"), "--dump-dir", str(work / "dump")]
    prep = ["--", *overrides] if overrides else []
    return [["./run.sh", "--stage", "0", "--stop-stage", "1", *dirs, *prep],
            ["./run.sh", "--stage", "2", "--stop-stage", "3", *dirs, "--exp-dir", str(work / f"seed{seed}"),
             "--", f"++seed={seed}", *overrides]]


def table(rows: list[dict], config: str, overrides: list[str]) -> str:
    """The markdown table of every seed, the mean and the range."""
    title = " ".join([config, *overrides])
    lines = [f"Dev error rate over seeds, {title}", "",
             "| seed | utts | CER % | WER % | missing/empty hyp | best / last valid loss | run time |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['utterances']} | {100 * r['cer']['rate']:.2f} | "
                     f"{100 * r['wer']['rate']:.2f} | {r['missing_or_empty']} | "
                     f"{min(r['valid_loss']):.3f} / {r['valid_loss'][-1]:.3f} | "
                     f"{r['seconds'] / 60:.1f} min |")
    if rows:
        wers = [100 * r["wer"]["rate"] for r in rows]
        lines.append(f"| mean of {len(rows)} | | {100 * mean_rate(rows, 'cer'):.2f} | "
                     f"{100 * mean_rate(rows, 'wer'):.2f} | | | |")
        lines.append(f"| range | | | {min(wers):.2f}-{max(wers):.2f} | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    own, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = program_parser(__doc__)
    parser.add_argument("--work-dir", type=Path, default=Path("seeds"))
    parser.add_argument("--config", default="conf/tiny_sensevoice.yaml")
    parser.add_argument("--seeds", default="0,1,2", help="comma separated training seeds")
    args = parser.parse_args(own)
    setup_logging()
    return run_main(lambda: run_seeds(args, overrides), log)


def run_seeds(args: argparse.Namespace, overrides: list[str]) -> int:
    """Every seed's runs, then the table; 1 when a run fails (its log named)."""
    seeds = [int(s) for s in split_list(args.seeds)]
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, seed in enumerate(seeds):
        run_log = work / f"seed{seed}.log"
        log.info("seed %d (%d/%d; log: %s)", seed, i + 1, len(seeds), run_log)
        start = time.monotonic()
        for cmd in seed_commands(work, args.config, seed, overrides):
            with open(run_log, "a", encoding="utf-8") as out:
                rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                log.error("seed %d failed (exit %d): %s; see %s", seed, rc, " ".join(cmd), run_log)
                return 1
        exp = work / f"seed{seed}"
        row = {"seed": seed, **run_row(exp / "decode_dev" / "result.json"),
               "valid_loss": read_validation_losses(exp / "curves.tsv"), "seconds": time.monotonic() - start}
        log.info("seed %d: WER %.2f%% CER %.2f%%, last validation loss %.3f (%.1f min)", seed,
                 100 * row["wer"]["rate"], 100 * row["cer"]["rate"], row["valid_loss"][-1],
                 row["seconds"] / 60)
        rows.append(row)
    text = table(rows, args.config, overrides)
    (work / "seeds.md").write_text(text, encoding="utf-8")
    summary = {"config": args.config, "overrides": overrides, "seeds": rows,
               "mean_wer": mean_rate(rows, "wer"), "mean_cer": mean_rate(rows, "cer")}
    (work / "seeds.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
