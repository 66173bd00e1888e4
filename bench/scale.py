#!/usr/bin/env python3
"""How the poolers scale with cores (`make bench-scale`): for machines with cores
to spare, where the 2-core `make bench` cannot show it.

One throwaway PostgreSQL; then, round after round, each target in turn: PostgreSQL
directly, PgBouncer and Sluice as one process or several `so_reuseport` processes
of one event loop each (the pool split between them, as PgBouncer users run it on
many cores), and one Sluice at each worker count asked for. Each pooler is started for its turn and stopped after
it, so only one runs at a time. With --pooler-cpus the pooler runs on those CPUs
and PostgreSQL and pgbench on the rest: the pooler's share of the machine is fixed,
and tps shows what it makes of it.

Writes scale.md and scale.json under --out. Standard library only.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time

from common import (
    BENCH_DIR, DB, USER, OPT, SCENARIOS, EXTRA_SCENARIOS, say, die, pg_bindir, which, ENV,
    raise_fd_limit, run_as_script,
)
from measure import run_pgbench
from report import fmt_num, median_of, machine_text, version_of
from servers import Runner, Postgres, Pooler, PoolerGroup


def cpu_list(text):
    """'8-11,14' -> {8, 9, 10, 11, 14}"""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


class Target:
    def __init__(self, label, make=None, workers=None):
        self.label = label
        self.make = make        # () -> a Pooler or PoolerGroup; None: PostgreSQL directly
        self.workers = workers  # Sluice's SLUICE_WORKERS for this target


def targets_from(args, runner, pg, userlist):
    """Each make() takes a fresh directory for that turn's pooler (its ini, log, socket)."""
    out = [Target("PostgreSQL")]

    def processes(name, binary, n):
        """n processes of one pooler on one port, the pool split between them."""
        def make(turn_dir):
            first = Pooler(name, binary, turn_dir, runner, pg, userlist)
            group = PoolerGroup(first, n) if n > 1 else first
            for m in getattr(group, "members", [group]):
                m.pool_size = max(1, OPT.pool_size // n)
            return group
        return make

    for n in args.pgbouncer_procs:
        out.append(Target("PgBouncer x%d" % n, processes("pgbouncer", args.pgbouncer, n)))
    builds = [("Sluice", args.sluice)] + ([("Sluice B", args.compare)] if args.compare else [])
    for name, binary in builds:
        for n in args.sluice_procs:
            # One event loop each, as PgBouncer's processes.
            out.append(Target("%s x%d" % (name, n), processes("sluice", binary, n), workers=0))

        def one_sluice(turn_dir, binary=binary):
            return Pooler("sluice", binary, turn_dir, runner, pg, userlist)

        for w in args.workers:
            out.append(Target("%s %dw" % (name, w), one_sluice, workers=w))
    return out


def run_target(t, turn, pgbench, pg, work, seconds, pooler_cpus, rest_cpus):
    """Every scenario once against one target; returns {scenario key: result}."""
    pooler = None
    results = {}
    try:
        if t.make:
            turn_dir = os.path.join(work, "turn%d" % turn)
            os.mkdir(turn_dir)
            pg.runner.own(turn_dir)
            pooler = t.make(turn_dir)
            OPT.workers = t.workers
            if pooler_cpus:
                os.sched_setaffinity(0, pooler_cpus)  # the pooler inherits it
            try:
                pooler.start()
            finally:
                if rest_cpus:
                    os.sched_setaffinity(0, rest_cpus)
            pooler.warm_up(pgbench)
        for scen in OPT.scenarios:
            if t.make:
                members = getattr(pooler, "members", [pooler])
                host = members[0].sockdir if scen.via == "unix" else "127.0.0.1"
                port = pooler.port
            else:
                host = pg.sock if scen.via == "unix" else "127.0.0.1"
                port = pg.port
            r = run_pgbench(pgbench, scen, host, port, seconds, work, pooler)
            if "cpu_s" in r and r.get("wall"):
                r["cores"] = r["cpu_s"] / r["wall"]
            results[scen.key] = r
            if "error" in r:
                say("  %-14s %-40s FAILED: %s" % (t.label, scen.title, r["error"]))
            else:
                say("  %-14s %-40s %9s tps  p99 %7.2f ms%s" % (
                    t.label, scen.title, fmt_num(r["tps"]), r.get("lat_p99_ms") or 0,
                    "  cpu %.3f s/10k tx, %.2f cores" % (r["cpu_per_10k"], r["cores"])
                    if "cores" in r else ""))
    finally:
        if pooler is not None:
            pooler.stop()
    return results


def render(meta, targets, raw):
    lines = ["# How the poolers scale with cores", "",
             "%s. %s." % (meta["date"], meta["machine"]), "",
             "pgbench -j %d -T %d, median of %d round(s); pool of %d server connections "
             "(split evenly over PgBouncer's processes); pooler CPUs: %s; %s; %s; %s." % (meta["jobs"], meta["seconds"], meta["rounds"], meta["pool_size"],
                                 meta["pooler_cpus"], meta["sluice"], meta["pgbouncer"], meta["postgres"]),
             "", "Sluice Nw: N worker threads (SLUICE_WORKERS=N; 0: one event loop on the main "
             "thread, its default on up to 2 cores). PgBouncer xN, Sluice xN: N processes "
             "of one event loop each on one port (so_reuseport), each with its share of the "
             "pool. Cores used: the pooler's CPU seconds "
             "over the run's wall time.", ""]
    for scen in OPT.scenarios:
        lines += ["## %s" % scen.describe(), "",
                  "| target | tps | x PgBouncer x1 | CPU s/10k tx | cores used | p99 ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        base = median_of(raw[scen.key].get("PgBouncer x1", []), "tps")
        for t in targets:
            runs = raw[scen.key][t.label]
            tps = median_of(runs, "tps")
            if tps is None:
                errs = [r["error"] for r in runs if "error" in r]
                lines.append("| %s | failed: %s | | | | |" % (t.label, errs[0] if errs else "no runs"))
                continue
            cpu = median_of(runs, "cpu_per_10k")
            cores = median_of(runs, "cores")
            p99 = median_of(runs, "lat_p99_ms")
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                t.label, fmt_num(tps), "%.2fx" % (tps / base) if base else "",
                "%.3f" % cpu if cpu is not None else "", "%.2f" % cores if cores is not None else "",
                "%.2f" % p99 if p99 is not None else ""))
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="how Sluice and PgBouncer scale with cores")
    ap.add_argument("--workers", default="0,1,2,4,8",
                    help="Sluice worker counts (comma list; 0: one event loop, no worker threads)")
    ap.add_argument("--pgbouncer-procs", default="1,4",
                    help="PgBouncer process counts (comma list; >1: so_reuseport)")
    ap.add_argument("--sluice-procs", default="",
                    help="Sluice process counts, one event loop each (comma list; >1: so_reuseport)")
    ap.add_argument("--only", default="select1_64,select_64,select_256",
                    help="scenario keys (bench/common.py)")
    ap.add_argument("--pool-size", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=8, help="pgbench -j")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=int, default=10, help="pgbench -i -s")
    ap.add_argument("--pooler-cpus", help="pin the pooler to these CPUs (say 8-11), the rest to the others")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN",
                                                       os.path.join(BENCH_DIR, "..", "target/release/sluice")))
    ap.add_argument("--pgbouncer", default=os.environ.get("PGBOUNCER_BIN") or which("pgbouncer", ["/usr/sbin"]))
    ap.add_argument("--compare", metavar="PATH",
                    help="a second Sluice binary, run as the first is ('Sluice B' rows), "
                         "interleaved with it: a change measured before and after")
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) at the end")
    args = ap.parse_args()
    args.workers = [int(w) for w in args.workers.split(",") if w]
    args.pgbouncer_procs = [int(n) for n in args.pgbouncer_procs.split(",") if n]
    args.sluice_procs = [int(n) for n in args.sluice_procs.split(",") if n]
    OPT.pool_size, OPT.jobs = args.pool_size, args.jobs
    known = {s.key: s for s in SCENARIOS + EXTRA_SCENARIOS}
    keys = args.only.split(",")
    if set(keys) - set(known):
        die("unknown scenario(s) %s" % ", ".join(sorted(set(keys) - set(known))))
    OPT.scenarios = [known[k] for k in keys]
    if any(s.tls for s in OPT.scenarios):
        die("the TLS scenario is make bench's only (its poolers here offer no TLS)")
    if any(s.clients < OPT.jobs for s in OPT.scenarios):
        die("pgbench -j %d needs at least as many clients in every scenario" % OPT.jobs)
    for b in [args.sluice] + ([args.compare] if args.compare else []):
        if not os.access(b, os.X_OK):
            die("%s not found; run 'cargo build --release'" % b)
    if args.pgbouncer_procs and not args.pgbouncer:
        die("pgbouncer not found; run bench/install-deps.sh")
    pooler_cpus = rest_cpus = None
    if args.pooler_cpus:
        pooler_cpus = cpu_list(args.pooler_cpus)
        rest_cpus = os.sched_getaffinity(0) - pooler_cpus
        if not rest_cpus or not pooler_cpus <= os.sched_getaffinity(0):
            die("--pooler-cpus %s leaves no CPUs for the rest, or names CPUs not ours" % args.pooler_cpus)
        os.sched_setaffinity(0, rest_cpus)  # PostgreSQL and pgbench inherit it
    bindir = pg_bindir()
    pgbench = which("pgbench", [bindir]) or die("pgbench not found; run 'make deps'")
    psql = which("psql", [bindir]) or die("psql not found; run 'make deps'")
    raise_fd_limit()

    runner = Runner()
    work = tempfile.mkdtemp(prefix="pooler-scale.", dir="/tmp" if runner.root else None)
    os.chmod(work, 0o755)
    runner.own(work)
    pg = Postgres(work, runner, bindir)
    t_start = time.monotonic()
    try:
        say("scale: starting PostgreSQL (%s) in %s" % (bindir, work))
        pg.start()
        subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", pg.sock, "-p", str(pg.port),
                        "-U", USER, "-d", "postgres", "-c", "CREATE DATABASE %s" % DB],
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
        init = subprocess.run([pgbench, "-i", "-s", str(args.scale), "-q", "-h", pg.sock, "-p", str(pg.port),
                               "-U", USER, DB], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if init.returncode:
            die("pgbench -i failed:\n" + init.stdout)
        userlist = os.path.join(work, "userlist.txt")
        with open(userlist, "w") as f:
            f.write('"%s" ""\n' % USER)
        for s in OPT.scenarios:
            if s.script:
                with open(os.path.join(work, s.script_name()), "w") as f:
                    f.write(s.script)
        targets = targets_from(args, runner, pg, userlist)
        raw = {s.key: {t.label: [] for t in targets} for s in OPT.scenarios}
        turn = 0
        for rnd in range(1, args.rounds + 1):
            for t in targets:
                turn += 1
                say("scale: round %d/%d, %s (%.0f s so far)" % (rnd, args.rounds, t.label,
                                                                 time.monotonic() - t_start))
                res = run_target(t, turn, pgbench, pg, work, args.seconds, pooler_cpus, rest_cpus)
                for key, r in res.items():
                    raw[key][t.label].append(r)
        meta = {
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "machine": machine_text(),
            "sluice": version_of([args.sluice, "-V"]) + (
                " (B: %s)" % args.compare if args.compare else ""),
            "pgbouncer": version_of([args.pgbouncer, "--version"]) if args.pgbouncer else "-",
            "postgres": version_of([os.path.join(bindir, "postgres"), "--version"]),
            "jobs": OPT.jobs, "seconds": args.seconds, "rounds": args.rounds,
            "pool_size": OPT.pool_size, "pooler_cpus": args.pooler_cpus or "any",
        }
        md = render(meta, targets, raw)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scale.md"), "w") as f:
            f.write(md)
        with open(os.path.join(args.out, "scale.json"), "w") as f:
            json.dump({"meta": meta, "raw": raw}, f, indent=1)
        say("")
        say(md)
        say("scale: wrote %s (%.0f s in all)" % (os.path.join(args.out, "scale.md"), time.monotonic() - t_start))
    finally:
        pg.stop()
        if args.keep:
            say("scale: kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_as_script(main, "scale")
