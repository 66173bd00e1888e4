"""The report: medians over the rounds, the markdown table and the SVG chart,
and what the report says about the machine and versions."""

import math
import os
import platform
import re
import statistics
import subprocess

from common import MAX_CLIENT_CONN, TARGETS, LABEL, OPT, CHART, ENV
from targets import render_targets


# --------------------------------------------------------------------------
# report


def fmt_num(v, digits=0):
    if v is None:
        return "-"
    if digits == 0:
        return "{:,.0f}".format(v)
    return "{:,.{}f}".format(v, digits)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    return "%.2fx" % (a / b)


def median_of(runs, field):
    vals = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(vals) if vals else None


def aggregate(raw, rounds):
    """Per scenario and target: medians over the rounds that succeeded."""
    agg = {}
    for scen in OPT.scenarios:
        agg[scen.key] = {}
        for t in TARGETS:
            runs = raw.get(scen.key, {}).get(t, [])
            good = [r for r in runs if "error" not in r]
            a = {"ok_rounds": len(good), "rounds": len(runs),
                 "errors": [r["error"] for r in runs if "error" in r]}
            for f in ("tps", "lat_avg_ms", "lat_p99_ms", "cpu_per_10k", "pgbench_per_10k",
                      "postgres_per_10k", "all_per_10k"):
                a[f] = median_of(good, f)
            agg[scen.key][t] = a
    return agg


def tps_cell(a):
    if a["rounds"] == 0:
        return "-"
    if a["ok_rounds"] == 0:
        return "failed"
    s = fmt_num(a["tps"])
    if a["ok_rounds"] < a["rounds"]:
        s += " (%d/%d ok)" % (a["ok_rounds"], a["rounds"])
    return s


def lat_cell(agg_s, field):
    vals = []
    for t in TARGETS:
        a = agg_s[t]
        vals.append("-" if a[field] is None else ("%.2f" % a[field]))
    return " / ".join(vals)


def render_markdown(meta, agg, raw, idle, chart_name):
    L = []
    L.append("# Sluice vs PgBouncer vs PostgreSQL")
    L.append("")
    L.append("%s, %s. %s." % (meta["date"], meta["mode"], meta["machine"]))
    L.append("")
    L.append("- Sluice %s, %s build; %s; PostgreSQL %s (direct)." % (
        meta["sluice"], meta.get("sluice_build", "release"), meta["pgbouncer"], meta["postgres"]))
    L.append("- Both poolers: `pool_mode=transaction`, `default_pool_size=%d`, `max_client_conn=%d`, "
             "auth `trust`, run as `%s`, open-files limit %d. PostgreSQL: `max_connections=700`, "
             "`fsync=off`, `shared_buffers=128MB`, pgbench scale 10."
             % (OPT.pool_size, MAX_CLIENT_CONN, meta["run_as"], meta["nofile"]))
    L.append("- pgbench `-j %d -T %s`, %d round(s), interleaved Sluice, PgBouncer, direct; "
             "each figure is the median over the rounds." % (OPT.jobs, meta["seconds"], meta["rounds"]))
    L.append("- Sluice's worker threads: %s." % meta["workers"])
    if any(s.tls for s in OPT.scenarios):
        L.append("- TLS scenarios: PostgreSQL and both poolers present one self-signed %s key."
                 % meta.get("tls_key", "ECDSA P-256"))
    L.append("")
    L.append("| scenario | Sluice tps | PgBouncer tps | direct tps | Sluice/direct | Sluice/PgBouncer "
             "| avg latency ms (S / B / D) | p99 latency ms (S / B / D) "
             "| CPU s per 10k tx Sluice | CPU s per 10k tx PgBouncer | CPU Sluice/PgBouncer |")
    L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for scen in OPT.scenarios:
        a = agg[scen.key]
        s, b, d = a["sluice"], a["pgbouncer"], a["direct"]
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            scen.title, tps_cell(s), tps_cell(b), tps_cell(d),
            ratio(s["tps"], d["tps"]), ratio(s["tps"], b["tps"]),
            lat_cell(a, "lat_avg_ms"), lat_cell(a, "lat_p99_ms"),
            fmt_num(s["cpu_per_10k"], 3), fmt_num(b["cpu_per_10k"], 3),
            ratio(s["cpu_per_10k"], b["cpu_per_10k"])))
    L.append("")
    L.append("S / B / D: Sluice / PgBouncer / direct. CPU: user + system time of the pooler process "
             "(all threads) during the run, per 10,000 transactions; lower is better. "
             "Under `-C`, tps includes the reconnections and the average latency is pgbench's "
             "(run time x clients / transactions, so it includes them too), while p99 is "
             "per transaction as pgbench logs it, after the connect.")
    L.append("")
    L.extend(render_targets(agg, idle, {scen.key: scen.title for scen in OPT.scenarios},
                            meta["rounds"]))
    if idle:
        L.append("## Idle clients")
        L.append("")
        L.append("| idle clients | pooler | logged in | still connected | errors | RSS before MB "
                 "| RSS after MB | KB per client | time to open s |")
        L.append("|--:|---|--:|--:|---|--:|--:|--:|--:|")
        for row in idle:
            r = row["result"]
            if "skipped" in r:
                L.append("| %s | %s | - | - | %s | - | - | - | - |" % (
                    fmt_num(row["count"]), LABEL[row["pooler"]], r["skipped"]))
                continue
            errs = "; ".join("%s: %s" % (k, fmt_num(v)) for k, v in sorted(r["errors"].items(),
                                                                          key=lambda kv: -kv[1]))
            if not r["pooler_alive"]:
                errs = ("pooler exited; " + errs) if errs else "pooler exited"
            procs = r.get("processes", 1)
            who = LABEL[row["pooler"]] + (" (%d processes)" % procs if procs > 1 else "")
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                fmt_num(r["requested"]), who, fmt_num(r["accepted"]),
                fmt_num(r["still_connected"]), errs or "none",
                fmt_num(r["rss_before_kb"] / 1024, 1),
                fmt_num(None if r["rss_after_kb"] is None else r["rss_after_kb"] / 1024, 1),
                fmt_num(r.get("kb_per_client"), 2), fmt_num(r["open_s"], 1)))
        L.append("")
        L.append("Each client completes a `trust` login (to ReadyForQuery) and stays idle. "
                 "KB per client = (RSS after - RSS before) / clients logged in, measured on a freshly "
                 "started pooler. Time to open is bounded by the Python client as much as by the pooler.")
        if meta.get("idle_note"):
            L.append(meta["idle_note"])
        L.append("")
    L.extend(render_machine(agg))
    L.extend(render_rounds(raw))
    fails = []
    for scen in OPT.scenarios:
        for t in TARGETS:
            a = agg[scen.key][t]
            if a["errors"]:
                fails.append("- %s, %s (%d of %d rounds): %s" % (
                    scen.title, LABEL[t], len(a["errors"]), a["rounds"], a["errors"][0]))
    if fails:
        L.append("## Failures")
        L.append("")
        L.extend(fails)
        L.append("")
    L.append("## Scenarios")
    L.append("")
    for scen in OPT.scenarios:
        L.append("- %s: `%s`%s" % (scen.title, scen.describe(),
                                   " with `%s`" % scen.script.strip() if scen.script else ""))
    L.append("")
    if chart_name:
        L.append("![tps by client count](%s)" % chart_name)
    L.append("")
    return "\n".join(L)


def render_machine(agg):
    """Where the machine's CPU went per transaction: the pooler, pgbench and
    PostgreSQL, behind each pooler and direct."""
    def parts(a, pooler=True):
        keys = (["cpu_per_10k"] if pooler else []) + ["pgbench_per_10k", "postgres_per_10k"]
        return " / ".join(fmt_num(a.get(k), 3) for k in keys)

    if not any(agg[sc.key][t].get("all_per_10k") for sc in OPT.scenarios for t in TARGETS):
        return []
    L = ["## Where the machine's CPU went", "",
         "| scenario | Sluice: pooler / pgbench / PostgreSQL | all | PgBouncer: pooler / pgbench "
         "/ PostgreSQL | all | all, Sluice/PgBouncer | direct: pgbench / PostgreSQL | all |",
         "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for scen in OPT.scenarios:
        a = agg[scen.key]
        s, b, d = a["sluice"], a["pgbouncer"], a["direct"]
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            scen.title, parts(s), fmt_num(s.get("all_per_10k"), 3), parts(b),
            fmt_num(b.get("all_per_10k"), 3), ratio(s.get("all_per_10k"), b.get("all_per_10k")),
            parts(d, pooler=False), fmt_num(d.get("all_per_10k"), 3)))
    L.append("")
    L.append("CPU seconds (user + system) per 10,000 transactions, each the median over the rounds: "
             "the pooler's process, pgbench's (as its parent sees it) and PostgreSQL's (the "
             "postmaster and every process it started). When every core is busy, tps is the "
             "cores divided by what a transaction costs the three together, so a pooler gains by "
             "what it costs itself and by what it saves pgbench and PostgreSQL "
             "(docs/performance.md, twenty-third round).")
    L.append("")
    return L


def tps_spread(runs):
    """The lowest and highest tps of the runs that succeeded."""
    vals = [r["tps"] for r in runs if "error" not in r]
    if not vals:
        return "-"
    return "%s-%s" % (fmt_num(min(vals)), fmt_num(max(vals)))


def render_rounds(raw):
    """Each round's Sluice/PgBouncer tps ratio, the two runs of a round having
    been made back to back, and each pooler's spread over the rounds: on a shared
    2-core machine one round can differ from the next by 10-20%, and the median
    alone does not show whether a ratio near 1.0x is the code or the spread."""
    rows = []
    for scen in OPT.scenarios:
        s_runs = raw.get(scen.key, {}).get("sluice", [])
        b_runs = raw.get(scen.key, {}).get("pgbouncer", [])
        if len(s_runs) < 2:
            continue
        pairs, ratios = [], []
        for s, b in zip(s_runs, b_runs):
            ok = "error" not in s and "error" not in b and b.get("tps")
            if ok:
                ratios.append(s["tps"] / b["tps"])
            pairs.append("%.2fx" % ratios[-1] if ok else "-")

        paired = "%.2fx" % statistics.median(ratios) if ratios else "-"
        rows.append("| %s | %s | %s | %s | %s |" % (
            scen.title, " / ".join(pairs), paired, tps_spread(s_runs), tps_spread(b_runs)))
    if not rows:
        return []
    return ["## Round by round", "",
            "| scenario | Sluice/PgBouncer tps, each round | median of the rounds' ratios "
            "| Sluice tps, lowest-highest | PgBouncer tps, lowest-highest |",
            "|---|--:|--:|--:|--:|"] + rows + [
            "", "Each round runs Sluice and then PgBouncer back to back, so a round's ratio "
            "compares the two under the same load on the machine; the spread shows how far "
            "one round lies from the next. The main table divides the medians, which may "
            "come from different rounds; the median of the rounds' ratios pairs each run "
            "with its neighbour.", ""]


def render_svg(agg, subtitle):
    """tps against client count (log scale), select-only, one line per target."""
    W, H = 720, 440
    left, right, top, bottom = 80, 170, 50, 60
    pw, ph = W - left - right, H - top - bottom
    colors = {"sluice": "#1f77b4", "pgbouncer": "#ff7f0e", "direct": "#7f7f7f"}
    series = {t: [(c, agg[k][t]["tps"]) for k, c in CHART if agg[k][t]["tps"] is not None]
              for t in TARGETS}
    ymax = max([v for pts in series.values() for _, v in pts] + [1])
    # A "nice" axis top: 1, 2 or 5 times a power of ten.
    mag = 10 ** math.floor(math.log10(ymax))
    step = next(s * mag for s in (0.1, 0.2, 0.25, 0.5, 1, 2, 5) if ymax / (s * mag) <= 8)
    ytop = step * math.ceil(ymax / step)
    xs = [c for _, c in CHART]
    lx0, lx1 = math.log(xs[0]), math.log(xs[-1])

    def px(c):
        return left + (math.log(c) - lx0) / (lx1 - lx0) * pw

    def py(v):
        return top + ph - v / ytop * ph

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
         'font-family="sans-serif" font-size="12">' % (W, H, W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="24" font-size="15" font-weight="bold">select-only tps by client count '
         '(pool of %d server connections)</text>' % (left, OPT.pool_size),
         '<text x="%d" y="40" fill="#555">%s</text>' % (left, subtitle)]
    y = 0.0
    while y <= ytop + 1e-9:
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (left, py(y), left + pw, py(y)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (left - 6, py(y) + 4, fmt_num(y)))
        y += step
    for c in xs:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (px(c), top, px(c), top + ph))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (px(c), top + ph + 18, c))
    o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top + ph, left + pw, top + ph))
    o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top, left, top + ph))
    o.append('<text x="%.1f" y="%d" text-anchor="middle">pgbench clients (log scale)</text>'
             % (left + pw / 2, H - 15))
    o.append('<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">transactions per second</text>'
             % (top + ph / 2))
    for i, t in enumerate(TARGETS):
        pts = series[t]
        if len(pts) > 1:
            o.append('<polyline fill="none" stroke="%s" stroke-width="2.5" points="%s"/>' % (
                colors[t], " ".join("%.1f,%.1f" % (px(c), py(v)) for c, v in pts)))
        for c, v in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s, %d clients: %s tps</title></circle>'
                     % (px(c), py(v), colors[t], LABEL[t], c, fmt_num(v)))
        ly = top + 10 + i * 22
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>'
                 % (left + pw + 20, ly, left + pw + 44, ly, colors[t]))
        o.append('<text x="%d" y="%d">%s</text>' % (left + pw + 50, ly + 4,
                                                   LABEL[t] + (" (direct)" if t == "direct" else "")))
    o.append("</svg>")
    return "\n".join(o) + "\n"


# --------------------------------------------------------------------------
# main


def version_of(argv):
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=10, env=ENV).stdout
        return out.strip().splitlines()[0] if out.strip() else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def first_version_number(text):
    """"postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> "15.18"."""
    m = re.search(r"\d+(?:\.\d+)*", text)
    return m.group(0) if m else text


def machine_text():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%d CPUs%s, Linux %s" % (os.cpu_count() or 0, " (%s)" % model if model else "", platform.release())
