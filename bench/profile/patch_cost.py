"""bench/profile/patch_cost.py: what JIT's patch of ``Module.__call__`` adds to each module call.

While JIT works beside a program, every module call of the program's model goes through the
patch: the top module's own call and those of its children, a few hundred a call for BERT-base.
This times a forward of a chain of trivial modules (so that the module calls are the whole
cost) in one process, in rounds that take each state in turn:

- ``plain``: torch's own ``__call__``;
- ``being tuned``: JIT's patch, the top module's tune under way (its children not tried yet);
- ``decided``: the top module ended eager, its children decided (skipped).

It reports each state's time a forward and the added ns a module call over ``plain``, and, where
transformers is installed, how many module calls one forward of BertModel (base config) makes,
with what the patch adds to that forward in each state.

    python bench/profile/patch_cost.py [--blocks 60] [--rounds 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import commit  # bench/provenance.py


class _Leaf(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = _Leaf(), _Leaf(), _Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


class _Chain(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(blocks))
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # a module with weights, as JIT tunes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _per_forward_us(model: torch.nn.Module, x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        model(x)
    return (time.perf_counter() - start) / calls * 1e6


def bert_module_calls() -> int | None:
    """Module calls in one forward of BertModel (base config, b1 s16), or None without
    transformers."""
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return None
    model = BertModel(BertConfig()).eval()
    count = [0]
    hooks = [
        m.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        for m in model.modules()
    ]
    with torch.no_grad():
        model(torch.ones(1, 16, dtype=torch.long))
    for h in hooks:
        h.remove()
    return count[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="blocks of three leaves")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400, help="forwards a state a round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from honed.jit import patcher
    from honed.jit.hierarchy import State

    model = _Chain(args.blocks).eval()
    per_forward = 1 + 4 * args.blocks
    x = torch.zeros(1)
    from honed.jit import tuner

    # The top module is never tuned here: its tune's start is replaced by nothing.
    real_try = tuner.maybe_try
    tuner.maybe_try = lambda node: None
    getattr(patcher, "_TRY", []).clear()  # (where the patch keeps its own reference to it)
    patcher.install()
    patcher.STATE.enabled = True
    try:
        with torch.no_grad():
            model(x)  # found: its node and its children's
            root = patcher.STATE.roots[0]
            children = [n for n in patcher.STATE.nodes.values() if n is not root]

            def being_tuned() -> None:
                patcher.install()
                root.tried, root.state = True, State.RECORDING
                for n in children:
                    n.state, n.tried = State.RECORDING, False

            def decided() -> None:
                patcher.install()
                root.tried, root.state = True, State.EAGER
                for n in children:
                    n.state, n.tried = State.SKIPPED, True

            states = {"plain": patcher.uninstall, "being tuned": being_tuned, "decided": decided}
            times: dict[str, list[float]] = {name: [] for name in states}
            for _ in range(args.rounds):
                for name, enter in states.items():
                    enter()
                    model(x)
                    times[name].append(_per_forward_us(model, x, args.calls))
    finally:
        patcher.uninstall()
        patcher.STATE.enabled = False
        getattr(patcher, "_TRY", []).clear()
        tuner.maybe_try = real_try

    medians = {name: statistics.median(t) for name, t in times.items()}
    added_ns = {
        name: (medians[name] - medians["plain"]) / per_forward * 1e3
        for name in states
        if name != "plain"
    }
    bert = bert_module_calls()
    result: dict[str, Any] = {
        "commit": commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "module_calls_a_forward": per_forward,
        "us_a_forward": {k: round(v, 2) for k, v in medians.items()},
        "added_ns_a_module_call": {k: round(v, 1) for k, v in added_ns.items()},
        "bert_base_module_calls": bert,
    }
    if bert is not None:
        result["bert_base_added_us"] = {k: round(v * bert / 1e3, 1) for k, v in added_ns.items()}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
