"""Ratio tables: one per workload case and cache state, lazyvault first.

ratio = lazyvault cost / system cost, where cost is the time, the memory,
or for a throughput its inverse: below 1 lazyvault is better. lazyvault's
row also gives its result as a fraction of the physical limit that binds it
(see limits.py), where one applies.
"""

from __future__ import annotations

from collections import defaultdict

import columnar
from workloads import Context, Row


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if value >= scale:
                return f"{value / scale:,.3g} {name}".replace(".0 ", " ")
        return f"{value * 1e9:.0f} ns"
    if unit == "B/s":
        return f"{value / 1e9:.2f} GB/s"
    if unit == "B":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.0f} B"
    return f"{value:g}"


def ratio(lv: Row | None, row: Row) -> str:
    if lv is None or lv.value is None or row.value is None or row.value == 0 or lv.value == 0:
        return "-"
    r = row.value / lv.value if row.unit == "B/s" else lv.value / row.value
    return f"{r:.3g}"


def notes(row: Row) -> str:
    if row.skipped:
        return row.skipped
    parts = []
    for k, v in row.extra.items():
        if v is None:
            continue
        if k in ("read() bytes", "PSS per reader", "bytes", "in-band bytes", "array bytes"):
            parts.append(f"{k} {fmt(v, 'B')}")
        elif k == "seconds":
            parts.append(f"{fmt(v, 's')}")
        elif k == "limit":
            parts.append(v)
        else:
            parts.append(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}")
    return ", ".join(parts)


def limit_note(row: Row, limits: dict[str, float], ctx: Context) -> str | None:
    """lazyvault's result as a fraction of the limit that binds it."""
    if row.workload in "kl":
        return columnar.limit_note(row, limits, ctx)
    if row.value is None or row.cache != "warm":
        return None
    big = ctx.big_gib * 2**30
    if row.workload == "a" and "GiB array" in row.case:
        return f"{big / limits['write'] / row.value:.0%} of write+fsync bandwidth"
    if row.workload == "d" and "every byte" in row.case:
        return f"{big / limits['map_touch'] / row.value:.0%} of first-touch bandwidth"
    if row.workload == "d":
        return f"{limits['fault'] / row.value:.0%} is one page fault"
    if row.workload == "e":
        return f"{1000 * 32768 / limits['map_touch'] / row.value:.0%} of first-touch bandwidth"
    if row.workload == "g":
        return f"{row.value / (limits['sum'] * 2):.0%} of 2 cores' `.sum()` bandwidth"
    if row.workload == "c" and row.extra.get("read() bytes", 0) > 2**20:
        fraction = row.extra["read() bytes"] / limits["read"] / row.value
        return f"{fraction:.0%} of page-cache read bandwidth"
    return None


def _groups(rows: list[Row]) -> dict[tuple[str, str, str], list[Row]]:
    groups: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for row in rows:
        groups[(row.workload, row.case, row.cache)].append(row)
    return groups


def _ordered(group: list[Row]) -> list[Row]:
    return sorted(group, key=lambda r: r.system != "lazyvault")


def table(rows: list[Row], limits: dict[str, float], ctx: Context) -> str:
    out = []
    for (w, case, cache), group in _groups(rows).items():
        lv = next((r for r in group if r.system == "lazyvault"), None)
        out.append(f"({w}) {case} [{cache}]")
        for row in _ordered(group):
            extra = notes(row)
            if row.system == "lazyvault":
                extra = ", ".join(x for x in (extra, limit_note(row, limits, ctx)) if x)
            out.append(
                f"  {row.system:<14} {fmt(row.value, row.unit):>12} {ratio(lv, row):>8}  {extra}"
            )
    return "\n".join(out)


def markdown(rows: list[Row], limits: dict[str, float], ctx: Context) -> str:
    out = []
    for (w, case, cache), group in _groups(rows).items():
        lv = next((r for r in group if r.system == "lazyvault"), None)
        out += [
            f"### ({w}) {case}, {cache} cache",
            "",
            "| system | result | lazyvault / system | notes |",
            "|---|---|---|---|",
        ]
        for row in _ordered(group):
            extra = notes(row)
            if row.system == "lazyvault":
                extra = ", ".join(x for x in (extra, limit_note(row, limits, ctx)) if x)
            out.append(
                f"| {row.system} | {fmt(row.value, row.unit)} | {ratio(lv, row)} | {extra} |"
            )
        out.append("")
    return "\n".join(out)


# (workload, case prefix, peer, cache, goal as the highest ratio, what)
TARGETS = [
    ("c", "scan 100,000", "pickle files", 0.01, "scan of 100k records >= 100x faster than pickles"),
    (
        "c",
        "scan 100,000",
        "SQLite+npy",
        1.0,
        "scan of 100k records no slower than SQLite json_extract",
    ),
    (
        "d",
        "first element of the",
        "numpy .npy",
        1.0,
        "first element of the big array <= np.load mmap",
    ),
    ("a", "write ", "numpy .npy", 1.1, "writing the big array within 10% of np.save"),
    ("d", "touch every byte", "numpy .npy", 1.1, "touching every byte within 10% of np.load mmap"),
    ("f", "write one object of", "numpy .npz", 1.0, "writing {many} small arrays <= np.savez"),
    ("f", "read all", "numpy .npz", 1.0, "reading {many} small arrays <= np.load of the npz"),
]


def targets(rows: list[Row], ctx: Context) -> str:
    """The issue's targets as measured in this run (warm cache); a target
    whose sizes the run did not use (e.g. ``--quick``) is "not measured"."""
    out = ["| target | lazyvault / peer | goal | met |", "|---|---|---|---|"]
    for w, prefix, peer, goal, what in TARGETS:
        what = what.format(many=f"{ctx.many:,}")
        group = [
            r for r in rows if r.workload == w and r.case.startswith(prefix) and r.cache == "warm"
        ]
        if w == "a":
            group = [r for r in group if "GiB array" in r.case]
        lv = next((r for r in group if r.system == "lazyvault"), None)
        other = next((r for r in group if r.system == peer), None)
        if lv is None or other is None or lv.value is None or other.value is None:
            why = "not measured (needs --sizes 100000)" if w == "c" else "not measured"
            out.append(f"| {what} | {why} | <= {goal:g} | - |")
            continue
        r = lv.value / other.value
        out.append(_target_row(what, f"{r:.3g}", f"<= {goal:g}", r <= goal))
    first = {
        r.case: r
        for r in rows
        if r.workload == "d" and r.system == "lazyvault" and r.cache == "warm"
    }
    big = next((r for c, r in first.items() if c.startswith("first element of the")), None)
    small = first.get("first element of a 4 KiB array")
    if big and small and big.value and small.value:
        r = big.value / small.value
        what = "first element independent of the array size (big / 4 KiB)"
        out.append(_target_row(what, f"{r:.3g}", "<= 1.5", r <= 1.5))
    hold = next(
        (
            r
            for r in rows
            if r.workload == "f" and r.case.startswith("hold") and r.system == "lazyvault"
        ),
        None,
    )
    if hold is not None:
        held = int(hold.case.split()[2].replace(",", ""))  # "hold all N arrays ..."
        ok = (
            hold.value is not None
            and hold.extra.get("fds", 999) < 256
            and hold.extra.get("maps", 10**6) < min(65530, held)
        )
        detail = hold.skipped or f"fds {hold.extra.get('fds')}, maps {hold.extra.get('maps')}"
        goal = "< 256 fds; maps < 65,530 and fewer than the arrays held"
        out.append(_target_row(f"{hold.case}: fds and maps bounded", detail, goal, ok))
    p5 = next((r for r in rows if r.workload == "i" and r.system == "lazyvault"), None)
    if p5 is not None and p5.value is not None:
        what = "pickle protocol 5 of the big object: extra memory"
        out.append(_target_row(what, fmt(p5.value, "B"), "< 1 MiB", p5.value < 2**20))
    return "\n".join(out)


def _target_row(what: str, measured: str, goal: str, met: bool) -> str:
    return f"| {what} | {measured} | {goal} | {'yes' if met else '**no**'} |"
