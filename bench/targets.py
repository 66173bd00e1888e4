"""The targets Sluice is held to (issue 6), checked against one run's figures: each
with the figure it asks for, what this run measured, and whether it holds. A table
of medians cannot say "met" on its own: the machine's spread between runs is 10-20%,
so a target near its line can hold in one run and not in the next
(docs/performance.md)."""

import json
import sys

# Scenario keys of common.SCENARIOS that the targets name.
AT_LEAST_1_15 = ["select1_tcp", "select1_unix", "select_256", "select_600"]
CONNECT = "select1_connect"
MANY = "select_600"
CPU_MAX = 0.8
SCALE = 50000


def _ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def _x(v):
    # Three places: a ratio of 1.149 must not read as the 1.15x it misses.
    return "-" if v is None else "%.3fx" % v


def _verdict(ok):
    return "-" if ok is None else ("met" if ok else "**missed**")


def _row(L, target, measured, ok):
    L.append("| %s | %s | %s |" % (target, measured, _verdict(ok)))


def _tps(agg, key):
    a = agg.get(key)
    if not a:
        return None
    return _ratio(a["sluice"]["tps"], a["pgbouncer"]["tps"])


def _idle(idle, count, pooler):
    for row in idle or []:
        if row["count"] == count and row["pooler"] == pooler:
            return row["result"]
    return None


def render_targets(agg, idle, titles, rounds):
    """Markdown lines for the targets section. `agg`: the medians per scenario and
    pooler (report.aggregate); `idle`: the idle-client rows; `titles`: scenario key to
    title; `rounds`: how many rounds the medians are over. A target whose scenario did
    not run (or failed for a pooler) reads "-"."""
    caveat = ("" if rounds >= 3 else
              " One round is not enough to judge a target by: take these as a sketch.")
    L = ["## Targets", "",
         "The targets of issue 6 against this run's medians over %d round(s), Sluice against "
         "PgBouncer.%s" % (rounds, caveat), "",
         "| target | this run | verdict |", "|---|---|---|"]

    # tps at least 1.0x everywhere.
    ratios = {k: _tps(agg, k) for k in agg}
    known = {k: v for k, v in ratios.items() if v is not None}
    under = sorted((k for k, v in known.items() if v < 1.0), key=lambda k: known[k])
    lo = min(known.values()) if known else None
    text = "lowest %s" % _x(lo)
    if under:
        text += "; under 1.0x: " + ", ".join("%s %s" % (titles.get(k, k), _x(known[k])) for k in under)
    _row(L, "tps at least 1.0x PgBouncer in every scenario", text,
         None if not known else not under)

    for k in AT_LEAST_1_15:
        if k in agg:
            v = ratios.get(k)
            _row(L, "tps at least 1.15x: %s" % titles.get(k, k), _x(v),
                 None if v is None else v >= 1.15)

    cpus = {}
    for k, a in agg.items():
        v = _ratio(a["sluice"].get("cpu_per_10k"), a["pgbouncer"].get("cpu_per_10k"))
        if v is not None:
            cpus[k] = v
    over = sorted((k for k, v in cpus.items() if v > CPU_MAX), key=lambda k: -cpus[k])
    text = "%s-%s" % (_x(min(cpus.values())), _x(max(cpus.values()))) if cpus else "-"
    if over:
        text += "; over %.1fx: %s" % (CPU_MAX, ", ".join(
            "%s %s" % (titles.get(k, k), _x(cpus[k])) for k in over))
    _row(L, "pooler CPU per transaction at most %.1fx PgBouncer's" % CPU_MAX, text,
         None if not cpus else not over)

    if CONNECT in agg:
        v = ratios.get(CONNECT)
        _row(L, "new connection per transaction (-C) at least 1.0x", _x(v),
             None if v is None else v >= 1.0)

    s, b = _idle(idle, 10000, "sluice"), _idle(idle, 10000, "pgbouncer")
    ks = s.get("kb_per_client") if s else None
    kb = b.get("kb_per_client") if b else None
    _row(L, "memory per idle client at most PgBouncer's (10,000 idle)",
         "-" if ks is None or kb is None else "%.2f KB against %.2f KB" % (ks, kb),
         None if ks is None or kb is None else ks <= kb)

    if MANY in agg:
        ps = agg[MANY]["sluice"].get("lat_p99_ms")
        pb = agg[MANY]["pgbouncer"].get("lat_p99_ms")
        _row(L, "p99 latency at 600 clients no higher than PgBouncer's",
             "-" if ps is None or pb is None else "%.1f ms against %.1f ms" % (ps, pb),
             None if ps is None or pb is None else ps <= pb)

    r = _idle(idle, SCALE, "sluice")
    if r is None:
        _row(L, "50,000 idle clients accepted without error", "not run", None)
    elif "skipped" in r:
        _row(L, "50,000 idle clients accepted without error", "skipped: %s" % r["skipped"], None)
    else:
        ok = (r["accepted"] == r["requested"] and not r["errors"] and r["pooler_alive"])
        _row(L, "50,000 idle clients accepted without error",
             "%s of %s logged in, %s errors" % (
                 "{:,}".format(r["accepted"]), "{:,}".format(r["requested"]),
                 sum(r["errors"].values()) if r["errors"] else "no"), ok)
    L.append("")
    return L


def main(argv):
    """Prints the targets section of a results.json written by an earlier run."""
    if len(argv) != 2:
        sys.stderr.write("usage: targets.py RESULTS.json\n")
        return 2
    with open(argv[1]) as f:
        d = json.load(f)
    from common import SCENARIOS, EXTRA_SCENARIOS
    titles = {s.key: s.title for s in SCENARIOS + EXTRA_SCENARIOS}
    rounds = d.get("meta", {}).get("rounds", 0)
    print("\n".join(render_targets(d["aggregate"], d.get("idle"), titles, rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
