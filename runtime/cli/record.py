"""ostinato-record: record a routing profile by replaying agent sessions through the model.

  ostinato-record MODEL --sessions FILE -o profile.safetensors [--limit-sessions N] [--scale S] ...

It runs the model, so it lives on the runtime side; reading, merging and importing profiles is
offline work (ostinato-profile). A checkpoint with an MTP block (mtp.0.*) is loaded with it, and the
block follows every session as speculative decoding runs it: the profile gets its routes as one more
row, from which ostinato-compile places the block's hot experts (--no-mtp: without it), and its
depth-1 greedy draft acceptance is measured at every decode step (the profile's mtp_drafts/mtp_agreed),
which ostinato-compile prices speculation at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ostinato.checkpoint import CheckpointError
from ostinato.cli.common import InputError, check_model_dir, check_output_file, refuse
from ostinato.profile_format import ProfileError
from ostinato.workload import WorkloadError, read_sessions, shrink_sessions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ostinato-record",
                                description="Record a routing profile: replay agent sessions (workload CSV) through "
                                            "the model and count the routes of every layer and expert, by phase. "
                                            "Reports, merges and imports: ostinato-profile.")
    p.add_argument("model", type=Path, help="checkpoint directory")
    p.add_argument("--sessions", type=Path, required=True, help="workload CSV (e.g. plans/workloads/agent_turns.csv)")
    p.add_argument("-o", "--output", type=Path, required=True, help="profile file to write (.safetensors)")
    p.add_argument("--phase-boundary", type=int, default=1024,
                   help="prefills of more tokens than this count as long prefill (1024)")
    p.add_argument("--first-session", type=int, default=0, help="skip this many sessions of the file (0)")
    p.add_argument("--limit-sessions", type=int, help="replay at most this many sessions")
    p.add_argument("--limit-turns", type=int, help="replay at most this many turns per session")
    p.add_argument("--max-generated", type=int, help="decode at most this many tokens per turn")
    p.add_argument("--scale", type=float, default=1.0, help="multiply appended tokens by this factor (1.0)")
    p.add_argument("--text", type=Path, help="text to draw token ids from (default: the package's corpus)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-mtp", action="store_true",
                   help="leave the checkpoint's MTP block out (default: it follows the sessions and the profile "
                        "gets its routes as one more row, for ostinato-compile to place its experts)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true",
                       help="a progress bar on stderr (turns done, rate, time left) even when it is not a terminal "
                            "(default: only on a terminal)")
    shown.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    for name in ("phase_boundary", "limit_sessions", "limit_turns"):
        v = getattr(a, name)
        if v is not None and v <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {v}")
    if a.first_session < 0:
        p.error(f"--first-session must be >= 0, got {a.first_session}")
    if a.max_generated is not None and a.max_generated < 0:
        p.error(f"--max-generated must be >= 0, got {a.max_generated}")
    if a.scale <= 0:
        p.error(f"--scale must be positive, got {a.scale}")
    return a


def progress_choice(a: argparse.Namespace) -> bool | None:
    """--progress: always, --quiet: never, else None: only when stderr is a terminal (tqdm's rule)."""
    return True if a.progress else False if a.quiet else None


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        check_model_dir(a.model)
        check_output_file(a.output, "--output")
        sessions = read_sessions(a.sessions)[a.first_session:]
        sessions = shrink_sessions(sessions[: a.limit_sessions] if a.limit_sessions else sessions, a.scale,
                                   a.limit_turns, a.max_generated)
        if not sessions:
            raise InputError(f"{a.sessions}: no sessions selected (check --first-session and --limit-sessions)")
        from ostinato.checkpoint.reader import Checkpoint

        from ..model.model import load_model  # the model and torch: only once the arguments are good
        from ..profile_recording import record_profile

        with Checkpoint.open(a.model, weights=False) as ckpt:
            mtp = ckpt.has_mtp and not a.no_mtp
        model = load_model(a.model, mtp=mtp)
        profile = record_profile(model, a.model, sessions, a.phase_boundary, a.seed, a.text,
                                 progress=progress_choice(a))
        profile.save(a.output)
    except (InputError, ProfileError, CheckpointError, WorkloadError) as e:
        return refuse("ostinato-record", e)
    acc = profile.mtp_acceptance
    print(f"wrote {a.output}: {len(sessions)} sessions, {profile.pass_tokens.numel()} forward passes, "
          f"{int(profile.counts.sum()):,d} routes" + (", the MTP block's included" if profile.mtp_layers else "")
          + ("" if acc is None else f"; MTP draft acceptance {acc:.1%} ({profile.mtp_agreed} of "
                                    f"{profile.mtp_drafts} greedy drafts kept)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
