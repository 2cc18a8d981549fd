"""Tiny model dirs of every family in the hub's layout, built from the bundled digits (random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from funasr_recipe.features.cmvn import CmvnStats, write_am_mvn
from funasr_recipe.features.fbank import FbankExtractor
from funasr_recipe.model.config import fbank_conf
from funasr_recipe.model.model_dir import make_model_dir
from funasr_recipe.model.tokenizer import build_tokenizer
from tests.helpers.configs import TINY
from tests.helpers.make_bad_kaldi_dir import DEFAULT_WAV_DIR

ROOT = Path(__file__).resolve().parents[2]


WORDS = "ZERO ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE".split()


# family -> (recipe config, tokenizer kind)
FAMILIES = {"SenseVoiceSmall": ("tiny_sensevoice.yaml", "sensevoice"),
            "Paraformer": ("tiny_paraformer.yaml", "bpe"),
            "ConformerCTC": ("tiny_conformer_ctc.yaml", "bpe")}


N_UTTS = 20


UNGATED_INT8 = ["--max-int8-wer-delta", "100"]  # module docstring: int8 of random weights is not judged


@pytest.fixture(scope="module")
def data_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stage-0 style data.jsonl of 20 real 8 kHz digit clips: every speaker, every digit."""
    wavs = sorted(DEFAULT_WAV_DIR.glob("*.wav"))[::125][:N_UTTS]
    if len(wavs) < N_UTTS:
        pytest.skip(f"{DEFAULT_WAV_DIR}: the bundled corpus is missing")
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for w in wavs:
            f.write(json.dumps({"key": w.stem, "source": str(w), "target": WORDS[int(w.stem.split("_")[0])],
                                "text_language": "<|en|>"}) + "\n")
    return path


def build_model_dir(root: Path, family: str, data: Path) -> Path:
    """A random-init model of ``family`` written by model/model_dir.py, as stage 3 writes one."""
    from funasr import AutoModel

    from funasr_recipe.model.trainer import register_recipe_classes

    register_recipe_classes()  # ConformerCTC is the recipe's: a test file run alone had not imported it

    config_name, kind = FAMILIES[family]
    cfg = OmegaConf.load(ROOT / "conf" / config_name)
    spec = cfg.pop("build_tokenizer")
    for section, sizes in TINY.items():
        for key, value in sizes.items():
            if section in cfg and key in cfg[section]:
                cfg[section][key] = value
    tokenizer = build_tokenizer(data, root / "tokenizer", kind, int(spec.vocab_size),
                                spec.get("sp_type", "bpe"))
    conf = fbank_conf(cfg)
    stats, extractor = CmvnStats(), FbankExtractor(conf)
    for line in data.read_text().splitlines():
        stats.add_lfr(extractor.from_file(json.loads(line)["source"]), conf.lfr_m, conf.lfr_n)
    write_am_mvn(root / "am.mvn", *stats.mean_std())
    cfg.tokenizer_conf.bpemodel = str(tokenizer)
    cfg.frontend_conf.cmvn_file = str(root / "am.mvn")
    exp = root / "exp"
    exp.mkdir()
    OmegaConf.save(cfg, exp / "config.yaml")
    torch.manual_seed(0)
    model = AutoModel(**OmegaConf.to_container(cfg), device="cpu", disable_update=True, disable_log=True,
                      disable_pbar=True, ncpu=torch.get_num_threads()).model
    torch.save(model.state_dict(), exp / "model.pt")
    return make_model_dir(exp, "model.pt", root / "final")
