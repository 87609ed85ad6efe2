"""read_model: the checkpoint's config, fingerprints and MTP block (its index and headers, never its weights);
the options that depend on the model (--context, --chat-encoding, --speculative) checked against it."""

from __future__ import annotations

from ostinato.chat_encodings import choose_encoding
from ostinato.checkpoint.config import ModelConfig
from ostinato.checkpoint.fingerprint import model_fingerprint
from ostinato.checkpoint.reader import INDEX_NAME, SINGLE_NAME, Checkpoint
from ostinato.checkpoint.tensor_specs import dspark_specs
from ostinato.checkpoint.weight_fingerprint import weight_fingerprint

from .build import Build
from .options import CHAT_ENCODINGS, SPECULATIVE, CompileError


def read_model(b: Build) -> None:
    root = b.options.model
    if (root / INDEX_NAME).exists() or (root / SINGLE_NAME).exists():
        ckpt = Checkpoint.open(root, weights=False)
        b.config, b.has_weights, b.has_mtp = ckpt.config, ckpt.has_weights, ckpt.has_mtp
        drafter = dspark_specs(b.config) if ckpt.has_dspark else {}
    else:
        b.config = ModelConfig.from_json(root)
        b.has_mtp = b.config.mtp_blocks > 0
        drafter = dspark_specs(b.config)
        b.notes.append("no weight index: sizes computed from config.json alone")
    if drafter:
        b.notes.append(dspark_note(b.config, drafter))
    o = b.options
    if o.context > b.config.max_position_embeddings:  # the model was trained (its rope scaled) for no more
        raise CompileError(f"--context {o.context:,d} is past the model's max_position_embeddings "
                           f"{b.config.max_position_embeddings:,d} ({root / 'config.json'}): plan at most "
                           f"--context {b.config.max_position_embeddings}")
    if o.chat_encoding not in CHAT_ENCODINGS:
        raise CompileError(f"--chat-encoding is {o.chat_encoding!r}: one of {', '.join(CHAT_ENCODINGS)}")
    if o.chat_encoding == "auto":
        b.chat_encoding, why = choose_encoding(root, b.config.has_dspark)
        b.notes.append(f"chat encoding {b.chat_encoding}: {why}")
    else:
        b.chat_encoding = o.chat_encoding
    if o.speculative not in SPECULATIVE:
        raise CompileError(f"--speculative is {o.speculative!r}: one of {', '.join(SPECULATIVE)}")
    if o.speculative == "mtp" and not b.has_mtp:
        if b.config.has_dspark:
            raise CompileError(f"--speculative mtp: {root} is the 0731 release, whose mtp.* tensors are a DSpark "
                               "drafter, not an MTP block (its config's dspark_* keys say so; "
                               "num_nextn_predict_layers 1 notwithstanding): Ostinato does not draft with it; "
                               "use --speculative auto or off")
        raise CompileError(f"--speculative mtp: {root} has no MTP block to draft with (no mtp.0.* tensors; its "
                           f"config's num_nextn_predict_layers is {b.config.num_nextn_predict_layers}): use "
                           "--speculative auto or off")
    b.mtp_placed = b.has_mtp and o.speculative != "off"
    b.fingerprint = model_fingerprint(root)
    b.weights = weight_fingerprint(root)  # the shards' bytes: a plan runs on exactly these weights
    if not b.has_weights:
        b.notes.append("no weights present: kernel build and weight checks skipped (planning only)")


def dspark_note(cfg: ModelConfig, drafter: dict) -> str:
    """What the plan says of a DSpark drafter: there, sized, and not loaded."""
    routed = sum(s.nbytes for s in drafter.values() if s.role == "routed_expert")
    total = sum(s.nbytes for s in drafter.values())
    return (f"the checkpoint carries a DSpark drafter (the 0731 release: mtp.0-mtp.{cfg.dspark_stages - 1}, "
            f"{len(drafter)} tensors, {total / 2**30:.2f} GiB of which {routed / 2**30:.2f} GiB routed experts; "
            f"block size {cfg.dspark_block_size}, target layers {list(cfg.dspark_target_layer_ids)}): present "
            "and unused: the plan does not load it and decodes without drafting")
