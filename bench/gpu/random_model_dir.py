"""A SenseVoiceSmall model dir with random weights, in the hub's layout, for bench/gpu/check.sh: what a
user's ``--pretrained-dir`` holds after downloading iic/SenseVoiceSmall, without the download.

Reads  funasr_recipe/model/released_configs/SenseVoiceSmall.yaml (the released architecture),
       conf/tiny_sensevoice.yaml (its tokenizer: ``build_tokenizer`` spec and class, and its encoder for
       ``--size tiny``), a stage-0 data.jsonl (transcripts
       for the tokenizer's learned pieces, the first ``--cmvn-utterances`` clips for am.mvn);
writes <out>/{model.pt, config.yaml, configuration.json, am.mvn, chn_jpn_yue_eng_ko_spectok.bpe.model,
       tokens.json} through funasr_recipe/model/model_dir.py (the recipe's one writer of model dirs), and
       <out>/.done; a rerun with the same inputs skips. configuration.json's "recipe" records the size
       and the parameter count (bench/gpu/report.py reads it for the FLOP utilisation).

  python -m bench.gpu.random_model_dir --data-jsonl data/train/data.jsonl --out exp/gpu_check/model
  python -m bench.gpu.random_model_dir --size tiny --count   # parameters only (meta device, no weights)
"""

from __future__ import annotations

import itertools
import logging
import sys
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from funasr_recipe.core.cli import program_parser, run_main
from funasr_recipe.core.jsonl import iter_jsonl
from funasr_recipe.core.log import setup_logging
from funasr_recipe.core.rejections import BadInputError
from funasr_recipe.dist.markers import fingerprint, is_done, mark_done, marker_info
from funasr_recipe.families.registry import SENSEVOICE
from funasr_recipe.features.cmvn import CmvnStats, write_am_mvn
from funasr_recipe.features.fbank import FbankExtractor
from funasr_recipe.model.architecture import build_model as build_network
from funasr_recipe.model.architecture import parameter_count as count_parameters
from funasr_recipe.model.config import fbank_conf
from funasr_recipe.model.model_dir import make_model_dir
from funasr_recipe.model.released import released_path
from funasr_recipe.model.tokenizer import SENSEVOICE_VOCAB_SIZE, build_tokenizer

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
RELEASED = released_path(str(SENSEVOICE.released))
TINY = ROOT / "conf" / "tiny_sensevoice.yaml"
SIZES = ("released", "tiny")


def architecture(size: str) -> DictConfig:
    """The model dir's config.yaml before its file paths: the released one, or with the demo's encoder."""
    if size not in SIZES:
        raise BadInputError(f"size {size!r}: one of {', '.join(SIZES)}")
    cfg, tiny = OmegaConf.load(RELEASED), OmegaConf.load(TINY)
    # The tokenizer has the released layout but pieces learned from the bundled corpus, which the recipe's
    # SenseVoiceTagTokenizer encodes (funasr_recipe/model/sensevoice_tokenizer.py: the released
    # SentencepiecesTokenizer would give each tag two tokens there).
    cfg.tokenizer = tiny.tokenizer
    cfg.tokenizer_conf = OmegaConf.merge({"bpemodel": None}, tiny.tokenizer_conf)
    if size == "tiny":
        cfg.encoder_conf = tiny.encoder_conf
    return cfg


def build_model(cfg: DictConfig, device: str = "cpu") -> torch.nn.Module:
    """The network of ``cfg``, randomly initialised (model/architecture.py), with the released vocabulary's
    output layer. ``device="meta"`` allocates no weights: the parameter count in seconds."""
    return build_network(cfg, SENSEVOICE_VOCAB_SIZE, device)


def write_am_mvn_of(data_jsonl: Path, cfg: DictConfig, path: Path, utterances: int) -> None:
    """am.mvn from the LFR-stacked fbank of the first ``utterances`` clips (a released model brings its
    own; random weights only need one of the right shape and range)."""
    conf, stats = fbank_conf(cfg), CmvnStats()
    extractor = FbankExtractor(conf)
    for _, item in itertools.islice(iter_jsonl(data_jsonl), utterances):
        stats.add_lfr(extractor.from_file(item["source"]), conf.lfr_m, conf.lfr_n)
    write_am_mvn(path, *stats.mean_std())


def write_model_dir(data_jsonl: Path, out: Path, size: str = "released", seed: int = 0,
                    cmvn_utterances: int = 200) -> int:
    """Write the model dir (skipped when ``out/.done`` is current); returns its parameter count."""
    fp = fingerprint(size, seed, cmvn_utterances, RELEASED.read_text(encoding="utf-8"),
                     TINY.read_text(encoding="utf-8"), files=[data_jsonl])
    if is_done(out / ".done", fp):
        log.info("%s is current; skipping (remove it to rebuild)", out)
        return int(marker_info(out / ".done")["parameters"])
    cfg = architecture(size)
    spec = OmegaConf.load(TINY).build_tokenizer
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".stage.") as tmp:
        stage = Path(tmp)
        bpe = build_tokenizer(data_jsonl, stage / "tokenizer", "sensevoice", int(spec.vocab_size),
                              spec.get("sp_type", "bpe"), tokenizer=cfg.tokenizer)
        write_am_mvn_of(data_jsonl, cfg, stage / "am.mvn", cmvn_utterances)
        cfg.tokenizer_conf.bpemodel = str(bpe)
        cfg.frontend_conf.cmvn_file = str(stage / "am.mvn")
        OmegaConf.save(cfg, stage / "config.yaml")
        torch.manual_seed(seed)
        model = build_model(cfg)
        params = count_parameters(model)
        torch.save(model.state_dict(), stage / "model.pt")
        del model
        # No training run made it: the staging dir is gone once this returns.
        make_model_dir(stage, "model.pt", out, info={"exp_dir": None, "checkpoint": "random_init",
                                                     "size": size, "seed": seed, "parameters": params})
    mark_done(out / ".done", fp, {"parameters": params})
    log.info("%s: SenseVoiceSmall (%s) with random weights, %.1f M parameters", out, size, params / 1e6)
    return params


def main(argv: list[str] | None = None) -> int:
    parser = program_parser(__doc__)
    parser.add_argument("--data-jsonl", type=Path, help="stage 0's data/<train>/data.jsonl")
    parser.add_argument("--out", type=Path, help="the model dir to write")
    parser.add_argument("--size", choices=SIZES, default="released",
                        help="released: the real SenseVoiceSmall; tiny: conf/tiny_sensevoice.yaml's encoder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cmvn-utterances", type=int, default=200, help="clips am.mvn is computed from")
    parser.add_argument("--count", action="store_true", help="print the parameter count and exit")
    args = parser.parse_args(argv)
    setup_logging()
    if args.count:
        return run_main(lambda: print(count_parameters(build_model(architecture(args.size), "meta"))), log)
    if args.data_jsonl is None or args.out is None:
        parser.error("--data-jsonl and --out are required (or --count)")
    # run_main takes a returned int for the exit code: the count is printed, not returned.
    return run_main(lambda: print(write_model_dir(args.data_jsonl, args.out, args.size, args.seed,
                                                  args.cmvn_utterances)), log)


if __name__ == "__main__":
    sys.exit(main())
