"""A/B of two benchmark runs: every cell both timed, its time in each run and the change.

    PYTHONPATH=kernels python -m gdn_replayssm.bench_compare A.jsonl B.jsonl [--out PATH]

Cells are matched on what defines a case (design, state dtype, acceptance, start, T, B, fold, ring length,
sweep), not on the switches that differ between the runs: those are the A/B. The baseline's cells are
compared too; their change is the run-to-run noise to read the ReplaySSM changes against. `change` is
B us / A us - 1: negative is faster in B.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .bench import _start, _table_order, read_rows_or_exit

Key = tuple[str, str, str, str, int, int, str, int, str]


def cell(row: dict[str, Any]) -> Key:
    """What makes two rows the same case in two runs."""
    replay = row["design"] == "replayssm"
    return (
        row["design"],
        row["state_dtype"],
        row["acceptance"],
        _start(row) if replay else "-",
        row["T"],
        row["B"],
        row.get("fold") or "-",
        row.get("ring_len") or 0,
        row.get("sweep") or "main",
    )


def _cells(rows: list[dict[str, Any]], name: str) -> dict[Key, dict[str, Any]]:
    cells: dict[Key, dict[str, Any]] = {}
    for row in rows:
        key = cell(row)
        if key in cells:
            raise ValueError(f"{name}: two rows for one case {key}: compare one run's rows, not merged runs")
        cells[key] = row
    return cells


def compare(a_rows: list[dict[str, Any]], b_rows: list[dict[str, Any]]) -> str:
    """The A/B table of the cells both runs timed, in the benchmark's plan order, and a count of the rest."""
    a, b = _cells(a_rows, "A"), _cells(b_rows, "B")
    both = sorted(a.keys() & b.keys(), key=lambda k: (k[0] != "baseline", *_table_order(a[k]), k[6], k[7], k[8]))
    lines = [
        f"{'design':>9} {'state':>5} {'accept':>12} {'start':>9} {'T':>2} {'B':>4} {'L':>4} "
        f"{'A_us':>9} {'B_us':>9} {'change':>7}"
    ]
    baseline_changes = []
    for k in both:
        a_us, b_us = a[k]["us"], b[k]["us"]
        change = b_us / a_us - 1
        if k[0] == "baseline":
            baseline_changes.append(change)
        design, state, accept, start, T, B, fold, L, sweep = k
        label = design if fold in ("-", "exact") else f"{design}:{fold}"
        lines.append(
            f"{label:>9} {state:>5} {accept:>12} {start:>9} {T:>2} {B:>4} {L or '-':>4} "
            f"{a_us:>9.1f} {b_us:>9.1f} {100 * change:>+6.1f}%" + ("" if sweep == "main" else f"  ({sweep} sweep)")
        )
    lines.append(
        f"# {len(both)} cells in both runs, {len(a.keys() - b.keys())} only in A, {len(b.keys() - a.keys())} only in B"
    )
    if baseline_changes:
        lines.append(
            f"# baseline change (run-to-run noise): {100 * min(baseline_changes):+.1f}% .. "
            f"{100 * max(baseline_changes):+.1f}% over {len(baseline_changes)} cells"
        )
    return "\n".join(lines)


def _identity_lines(label: str, path: Path, identities: list[dict[str, Any]]) -> list[str]:
    if not identities:
        return [f"# {label}: {path} (no identity line)"]
    return [
        f"# {label}: {path} src={i.get('src_sha256')} gpu={i.get('gpu')} command: bench {' '.join(i.get('argv', []))}"
        for i in identities
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdn_replayssm.bench_compare", description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path, metavar="A.jsonl", help="the reference run's JSON lines (bench --json / --out)")
    p.add_argument("b", type=Path, metavar="B.jsonl", help="the run to compare with it")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    loaded = [(label, path, *read_rows_or_exit(p, label, [path])) for label, path in (("A", args.a), ("B", args.b))]
    try:
        table = compare(loaded[0][2], loaded[1][2])
    except ValueError as e:
        p.error(str(e))
    header = [line for label, path, _, ids in loaded for line in _identity_lines(label, path, ids)]
    text = "\n".join([*header, table])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
