"""Naming the bad device(s) after a failed or slow all-reduce.

1. Pairs: the devices in disjoint pairs, all pairs at once. A passing pair clears both devices; a
   failing pair makes both suspects (an odd device out is a suspect until tested).
2. If no pair passed, other pairings of the suspects (round-robin rounds) until one passes, so
   that a known-good device exists.
3. Each suspect against a known-good device (several at once, each with a different good device):
   passing clears it, failing names it bad.

With no known-good device at all the suspects stay unresolved: preflight does not guess. `test`
runs groups on disjoint devices concurrently and returns one outcome per group, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from preflight.report import BisectionReport, GroupOutcome

GroupTest = Callable[[Sequence[tuple[int, ...]]], list[GroupOutcome]]


def disjoint_pairs(devices: Sequence[int]) -> tuple[list[tuple[int, int]], int | None]:
    pairs = [(devices[i], devices[i + 1]) for i in range(0, len(devices) - 1, 2)]
    leftover = devices[-1] if len(devices) % 2 else None
    return pairs, leftover


def round_robin(devices: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Every pairing round of the circle method; each pair of devices meets exactly once."""
    players: list[int | None] = list(devices)
    if len(players) % 2:
        players.append(None)
    rounds: list[list[tuple[int, int]]] = []
    n = len(players)
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = players[i], players[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def bisect(devices: Sequence[int], test: GroupTest) -> BisectionReport:
    ordered = sorted(set(devices))
    steps: list[GroupOutcome] = []
    good: list[int] = []
    suspects: list[int] = []
    tried: set[tuple[int, ...]] = set()

    def run(groups: Sequence[tuple[int, ...]]) -> list[GroupOutcome]:
        groups = [tuple(sorted(g)) for g in groups]
        tried.update(groups)
        outcomes = test(groups)
        steps.extend(outcomes)
        return outcomes

    pairs, leftover = disjoint_pairs(ordered)
    for pair, outcome in zip(pairs, run(pairs), strict=True):
        (good if outcome.ok else suspects).extend(pair)
    if leftover is not None:
        suspects.append(leftover)

    if not good:
        for pairing in round_robin(suspects):
            fresh = [p for p in pairing if p not in tried]
            if not fresh:
                continue
            passed = [p for p, o in zip(fresh, run(fresh), strict=True) if o.ok]
            for pair in passed:
                good.extend(d for d in pair if d not in good)
            if good:
                break
    suspects = [d for d in suspects if d not in good]
    if not good:
        return BisectionReport(
            bad=(),
            cleared=(),
            unresolved=tuple(suspects),
            steps=tuple(steps),
            reasons={d: "no pairing with this device passed, and no device is known good" for d in suspects},
        )

    bad: list[int] = []
    reasons: dict[int, str] = {}
    cleared: list[int] = []
    queue = list(suspects)
    while queue:
        batch, queue = queue[: len(good)], queue[len(good) :]
        groups = _partner(batch, good, tried)
        for (suspect, partner), outcome in zip(groups, run(groups), strict=True):
            if outcome.ok:
                cleared.append(suspect)
                good.append(suspect)
            else:
                bad.append(suspect)
                reasons[suspect] = f"failed with known-good device {partner}: {outcome.reason}"
    return BisectionReport(
        bad=tuple(sorted(bad)),
        cleared=tuple(sorted(cleared)),
        unresolved=(),
        steps=tuple(steps),
        reasons=reasons,
    )


def _partner(suspects: Sequence[int], good: Sequence[int], tried: set[tuple[int, ...]]) -> list[tuple[int, int]]:
    """Give each suspect its own known-good partner, preferring pairs not tested yet (a retest of
    a failed pair says nothing new)."""
    free = list(good)
    groups = []
    for suspect in suspects:
        fresh = [g for g in free if tuple(sorted((suspect, g))) not in tried]
        partner = (fresh or free)[0]
        free.remove(partner)
        groups.append((suspect, partner))
    return groups


def failure_of(report: BisectionReport, device: int) -> str | None:
    """The failure kind of the step that named `device` bad (for naming it in the device report)."""
    for step in reversed(report.steps):
        if device in step.devices and not step.ok:
            return step.failure
    return None
