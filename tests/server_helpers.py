"""What the server tests share: the tiny model's engine behind a real server on loopback, and a logits
hook that scripts the reply token by token (a constrained decode through the real engine)."""

from __future__ import annotations

from conftest import compile_tiny_plan
from tokenizers import Tokenizer

from ostinato.runtime.engine.loader import load_engine
from ostinato.server.app import create_app
from ostinato.server.background import serve_in_background


class Script:
    """A logits hook forcing a token sequence then EOS (id 1 in the tiny vocabulary); None: the model's own."""
    tokens: list | None = None

    def __call__(self, gen, logits):
        if self.tokens is None:
            return logits
        want = self.tokens[len(gen)] if len(gen) < len(self.tokens) else 1
        out = logits.clone().fill_(float("-inf"))
        out[want] = 0.0
        return out


def tiny_server(ckpt, work, kernel_dir, logits_hook, engine_options=None, **app_options):
    """(uvicorn server, base URL ending in /v1, app, engine, tokenizer): a cpu-only plan of `ckpt` compiled
    into `work` (context 1024), served in a background thread. Stop it with `server.should_exit = True`.
    `engine_options`: load_engine's keywords (speculative="mtp", ...)."""
    engine_options = engine_options or {}
    # a speculating engine needs the MTP block placed, whether or not the cost model says it pays here
    plan_options = {"speculative": "mtp"} if engine_options.get("speculative") == "mtp" else {}
    if engine_options.get("parallel", 1) > 1:  # the plan counts the memory of that many sessions
        plan_options["sessions"] = engine_options["parallel"]
    compile_tiny_plan(ckpt, work, kernel_dir, context=1024, **plan_options)
    engine = load_engine(work / "plan.yaml", ckpt, device="cpu", **engine_options)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    app = create_app(engine, tok, "tiny", logits_hook=logits_hook, **app_options)
    srv, base = serve_in_background(app)
    return srv, base, app, engine, tok
