"""What a GPU benchmark run is judged by, from its own rows: this package against the best
accurate peer (CUDA-graph time), and each shape's time over the compulsory-bytes floor next to
the last accepted run's (a jump shows in review; ``benchmarks/accepted_floor.json``)."""

from __future__ import annotations

import json
import os

from nkilib_msda.bench.report import Row, _pick
from nkilib_msda.bench.shapes import SHAPES

# Peers whose grad_value is accumulated in fp32 (msda-triton is run with fp32_grad_accum=True;
# its default bf16 atomics give grad_value errors of ~2e-2): "accurate" in the ratio.
ACCURATE_PEERS = ("msda-triton", "cuda")
PEER_TARGET = 0.6  # issue 31: ours / best accurate peer, fwd+bwd graph time
JUMP = 0.05  # a change of the time over the floor beyond this fraction is flagged


def _keys(rows: list[Row]) -> list[tuple[str, str]]:
    return sorted({(r.shape, r.dtype) for r in rows},
                  key=lambda k: (list(SHAPES).index(k[0]) if k[0] in SHAPES else 99, k[1]))


def _ours(rows: list[Row], shape: str, dtype: str) -> Row | None:
    """Our fwd+bwd graph row: the public function's, else the backend's."""
    return (_pick(rows, shape, dtype, "ours", "fwd+bwd", "graph")
            or _pick(rows, shape, dtype, "triton", "fwd+bwd", "graph"))


def peers_table(rows: list[Row]) -> str:
    """Per shape x dtype: fwd+bwd CUDA-graph µs of ours and of each accurate peer, and ours over
    the best of them (target PEER_TARGET)."""
    lines = ["| shape | dtype | ours fwd+bwd graph µs | " + " | ".join(
        f"{p} graph µs" for p in ACCURATE_PEERS) + f" | ours ÷ best accurate peer (target ≤ {PEER_TARGET}) |",
        "|---|---|---|" + "---|" * len(ACCURATE_PEERS) + "---|"]
    for shape, dtype in _keys(rows):
        ours = _ours(rows, shape, dtype)
        if ours is None:
            continue
        peers = [_pick(rows, shape, dtype, p, "fwd+bwd", "graph") for p in ACCURATE_PEERS]
        cells = ["—" if p is None else f"{p.us:.1f}" for p in peers]
        timed = [p.us for p in peers if p is not None]
        ratio = f"{ours.us / min(timed):.2f}" if timed else "—"
        lines.append(f"| {shape} | {dtype} | {ours.us:.1f} | {' | '.join(cells)} | {ratio} |")
    return "\n".join(lines)


def load_accepted(path: str) -> dict:
    """{"shape/dtype": {"over_floor", "us", "run"}} from ``path`` ({} when it does not exist)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["accepted"]


def accepted_entries(rows: list[Row], run: str) -> dict:
    """This run's fwd+bwd graph time over the floor per shape x dtype, labelled ``run``."""
    entries = {}
    for shape, dtype in _keys(rows):
        ours = _ours(rows, shape, dtype)
        if ours is not None:
            entries[f"{shape}/{dtype}"] = {"over_floor": round(ours.over_floor, 2),
                                           "us": round(ours.us, 1), "run": run}
    return entries


def write_accepted(path: str, rows: list[Row], run: str) -> None:
    """Record this run's values as the accepted ones (entries of shapes it did not run stay)."""
    accepted = load_accepted(path)
    accepted.update(accepted_entries(rows, run))
    with open(path, "w") as f:
        json.dump({"about": "fwd+bwd CUDA-graph time over the compulsory-bytes floor of the last "
                            "accepted GPU benchmark run (nkilib_msda/bench/guard.py)",
                   "accepted": dict(sorted(accepted.items()))}, f, indent=1)
        f.write("\n")


def floor_table(rows: list[Row], accepted: dict) -> str:
    """Per shape x dtype: this run's fwd+bwd graph time over the floor, the accepted value
    beside it and the change; changes beyond JUMP are flagged."""
    lines = ["| shape | dtype | fwd+bwd graph ÷ floor, this run | accepted (run) | change |",
             "|---|---|---|---|---|"]
    for shape, dtype in _keys(rows):
        ours = _ours(rows, shape, dtype)
        if ours is None:
            continue
        old = accepted.get(f"{shape}/{dtype}")
        if old is None:
            lines.append(f"| {shape} | {dtype} | {ours.over_floor:.2f}× | — | — |")
            continue
        change = ours.over_floor / old["over_floor"] - 1
        flag = " **jump**" if abs(change) > JUMP else ""
        lines.append(f"| {shape} | {dtype} | {ours.over_floor:.2f}× | {old['over_floor']:.2f}× "
                     f"({old['run']}) | {change:+.1%}{flag} |")
    return "\n".join(lines)
