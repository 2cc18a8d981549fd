"""Stage 3: decode a test set with a model dir, split over every process of every node; node 0 merges.

Reads  <model-dir> in the hub's layout (stage 3's exp/<tag>/final/ or a pretrained model) and
       <data-jsonl>, stage 0's manifest of the set (key, source, target, tags);
writes (work)  <out>/shards/<rank>.{jsonl,stats.json,done}: this rank's utterances, longest first and
               dealt round robin, decoded in batches by funasr's AutoModel on raw audio, as a deployed
               model sees it (funasr_recipe/model/inference.py);
       (merge) <out>/{ref.txt, hyp.txt, ref_tags.tsv, hyp_tags.tsv, failed.tsv, decode.json}
               (funasr_recipe/scoring/decode_dir.py), what local/score.py reads.
An unreadable file is reported with file, line and key and scored as deletions.

  .venv/bin/python -m local.decode work --model-dir exp/x/final --data-jsonl data/dev/data.jsonl \\
      --out exp/x/decode_dev --rank 0 --world-size 2
  .venv/bin/python -m local.decode work ... --after exp/x/final/.done FP   # waits for the averaged model
  .venv/bin/python -m local.decode merge --model-dir exp/x/final --tag x --data-jsonl data/dev/data.jsonl \\
      --out exp/x/decode_dev --world-size 2
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from funasr_recipe.compat.lazy_import import install as install_lazy_funasr
from funasr_recipe.core.cli import (
    add_shard_work_options,
    check_shard_work_options,
    program_parser,
    run_main,
    str2bool,
)
from funasr_recipe.core.jsonl import read_jsonl
from funasr_recipe.core.log import setup_logging
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, wait_for_marker
from funasr_recipe.dist.slicing import deal
from funasr_recipe.model.provenance import model_label
from funasr_recipe.scoring.decode_dir import decode_shard, merge_decode_dir, shard_file

log = logging.getLogger(__name__)


def work(args: argparse.Namespace) -> None:
    (args.out / "shards").mkdir(parents=True, exist_ok=True)
    if args.after:  # run.sh is still writing the model: import (seconds) while it does
        from funasr_recipe.model.model_dir import import_automodel

        import_automodel()
        wait_for_marker(Path(args.after[0]), args.after[1], "writing the model", args.wait_timeout, poll=0.1)
    done = shard_file(args.out, args.rank, "done")
    # What a finished shard was made from: the weights, the set and the split.
    fp = fingerprint(args.world_size, files=[args.model_dir / "model.pt", args.model_dir / "config.yaml",
                                             args.data_jsonl])
    if is_done(done, fp):
        log.info("%s: rank %d is done; skipping", args.out, args.rank)
        return
    mine = deal(read_jsonl(args.data_jsonl), args.rank, args.world_size,
                size=lambda it: int(it[1].get("source_len", 0)), key=lambda it: it[1]["key"])
    from funasr_recipe.model.inference import TorchASR  # funasr and torch: seconds to import

    stats = decode_shard(TorchASR(args.model_dir, args.device), mine, args.data_jsonl, args.out, args.rank,
                         args.device, args.batch_size, args.batch_frames)
    mark_done(done, fp)
    log.info("rank %d: %d utterances, %.1f s of audio in %.1f s (RTF %.4f)", args.rank, len(mine),
             stats["audio_seconds"], stats["decode_seconds"],
             stats["decode_seconds"] / max(stats["audio_seconds"], 1e-9))


def merge(args: argparse.Namespace) -> None:
    name = args.model_name or model_label(args.model_dir, args.tag, args.pretrained)
    merge_decode_dir(args.out, args.data_jsonl, args.world_size, name,
                     args.set_name or args.data_jsonl.parent.name, args.wait_timeout)


def build_parser() -> argparse.ArgumentParser:
    """This program's options (its --help; the docs' reference is made from it)."""
    parser = program_parser(__doc__)
    parser.add_argument("mode", choices=("work", "merge"))
    parser.add_argument("--data-jsonl", type=Path, required=True, help="stage 0's data/<set>/data.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="decode dir, e.g. exp/<tag>/decode_<set>")
    add_shard_work_options(parser)
    parser.add_argument("--model-dir", type=Path,
                        help="model dir in the hub's layout (work; merge: names the model)")
    parser.add_argument("--tag", default="model",
                        help="merge: the first word of the name of a model dir made before model dirs "
                        "recorded their run (model/provenance.py names the others)")
    parser.add_argument("--pretrained", type=str2bool, default=False,
                        help="merge: the model is the one fine-tuned from (named 'pretrained <dir>')")
    parser.add_argument("--model-name", help="merge: the model's name in the results (default: what "
                        "--model-dir's configuration.json records, model/provenance.py)")
    parser.add_argument("--after", nargs=2, metavar=("MARKER", "FINGERPRINT"),
                        help="work: wait (up to --wait-timeout) until MARKER holds FINGERPRINT before "
                        "reading --model-dir: run.sh starts the workers while it averages the model")
    parser.add_argument("--set-name", help="merge: the set's name in the results (default: its folder)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    if args.model_dir is None and (args.mode == "work" or args.model_name is None):
        parser.error(f"{args.mode} needs --model-dir" + ("" if args.mode == "work" else " or --model-name"))
    check_shard_work_options(parser, args)
    return run_main(lambda: work(args) if args.mode == "work" else merge(args), log)


if __name__ == "__main__":
    install_lazy_funasr()  # before anything imports funasr: compat/lazy_import.py says why
    sys.exit(main())
