#!/usr/bin/env python3
"""Sluice vs PgBouncer vs PostgreSQL, side by side (`make bench`, `make bench-quick`).

Starts a throwaway PostgreSQL, a Sluice and a PgBouncer in front of it with the
same pool (transaction mode, 4 server connections), runs pgbench scenarios
against all three in interleaved rounds, measures idle-client memory, and
writes bench/results/results.md (+ results.json, clients.svg).

See bench/README.md for what is measured and how to read the table.
Standard library only. Everything started here is stopped on exit.
"""

import argparse
import datetime
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time

from common import (
    ROOT, BENCH_DIR, MAX_CLIENT_CONN, DB, USER, OPT, SCENARIOS, EXTRA_SCENARIOS, CHART, say, die,
    pg_bindir, which, ENV, raise_fd_limit, run_as_script,
)
from measure import run_rounds, run_idle_tests, train
from report import (
    aggregate, render_markdown, render_svg, version_of, first_version_number, machine_text,
)
from servers import Runner, Postgres, Pooler, TlsFiles


def main():
    ap = argparse.ArgumentParser(description="Sluice vs PgBouncer vs PostgreSQL benchmark")
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s runs, no 50k idle test")
    ap.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    ap.add_argument("--seconds", type=int, help="pgbench -T per run (default 6, quick 2)")
    ap.add_argument("--only", help="comma list of scenario keys to run (default all)")
    ap.add_argument("--idle", type=int, default=10000, help="idle clients per pooler (0: skip)")
    ap.add_argument("--scale-idle", type=int, help="the idle scale test (default 50000, quick 0)")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target/release/sluice")))
    ap.add_argument("--pgbouncer", default=os.environ.get("PGBOUNCER_BIN") or which("pgbouncer", ["/usr/sbin"]))
    ap.add_argument("--out", default=os.path.join(BENCH_DIR, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs) at the end")
    ap.add_argument("--pool-size", type=int, default=OPT.pool_size,
                    help="default_pool_size of both poolers (default %d)" % OPT.pool_size)
    ap.add_argument("--jobs", type=int, default=OPT.jobs, help="pgbench -j (default %d)" % OPT.jobs)
    ap.add_argument("--workers", type=int,
                    help="Sluice's worker threads (SLUICE_WORKERS; default: its own choice by cores)")
    ap.add_argument("--tls-key", choices=["ecdsa", "rsa"], default="ecdsa",
                    help="the TLS scenarios' key: ECDSA P-256 (default) or RSA 2048")
    ap.add_argument("--train", metavar="DIR",
                    help="only run each scenario once against an instrumented Sluice, "
                         "which writes its profile into DIR (bench/pgo.sh)")
    args = ap.parse_args()
    OPT.pool_size, OPT.jobs, OPT.workers = args.pool_size, args.jobs, args.workers
    if args.train:
        OPT.profile_dir = os.path.abspath(args.train)
        os.makedirs(OPT.profile_dir, exist_ok=True)
    rounds = args.rounds or (1 if args.quick else 3)
    # 90 runs of 6 s (+ ~0.4 s each to connect and tear down) keep `make bench`
    # within 15 minutes with the profile-guided build and the idle-client tests.
    seconds = args.seconds or (2 if args.quick else 6)
    scale_idle = args.scale_idle if args.scale_idle is not None else (0 if args.quick else 50000)
    if args.only:
        keys = args.only.split(",")
        known = SCENARIOS + EXTRA_SCENARIOS
        unknown = set(keys) - {s.key for s in known}
        if unknown:
            die("unknown scenario(s) %s; known: %s" % (", ".join(sorted(unknown)),
                                                      ", ".join(s.key for s in known)))
        OPT.scenarios = [s for s in known if s.key in keys]
    too_few = [s.key for s in OPT.scenarios if s.clients < OPT.jobs]
    if too_few:
        die("pgbench -j %d needs at least as many clients; fewer in %s" % (OPT.jobs, ", ".join(too_few)))

    if not os.access(args.sluice, os.X_OK):
        die("%s not found; run 'cargo build --release'" % args.sluice)
    if not args.pgbouncer and not args.train:
        die("pgbouncer not found; run bench/install-deps.sh")
    bindir = pg_bindir()
    pgbench = which("pgbench", [bindir]) or die("pgbench not found; run 'make deps'")
    psql = which("psql", [bindir]) or die("psql not found; run 'make deps'")

    nofile = raise_fd_limit()
    if nofile < MAX_CLIENT_CONN + 100:
        say("bench: warning: open-files limit is %d (hard limit); PgBouncer wants more than "
            "max_client_conn=%d" % (nofile, MAX_CLIENT_CONN))

    runner = Runner()
    base = "/tmp" if runner.root else None  # nobody must be able to reach it
    # No "sluice" in the name: command lines of PostgreSQL, PgBouncer and
    # pgbench carry this path, and a `pkill -f sluice` aimed at stray Sluice
    # processes (say, from a test run nearby) must not take them down.
    work = tempfile.mkdtemp(prefix="pooler-bench.", dir=base)
    os.chmod(work, 0o755)
    runner.own(work)
    pg = Postgres(work, runner, bindir, TlsFiles(work, runner, args.tls_key))
    poolers = {}
    tls_poolers = {}  # for the TLS scenario: the same, offering TLS
    t_start = time.monotonic()
    try:
        if args.train:
            say("bench: work dir %s; training: %d scenario(s) once through Sluice, -T %d"
                % (work, len(OPT.scenarios), seconds))
        else:
            say("bench: work dir %s; %d round(s) x %d scenario(s) x 3 targets, -T %d"
                % (work, rounds, len(OPT.scenarios), seconds))
        say("bench: starting PostgreSQL (%s)" % bindir)
        pg.start()
        subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", pg.sock, "-p", str(pg.port),
                        "-U", USER, "-d", "postgres", "-c", "CREATE DATABASE %s" % DB],
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
        say("bench: pgbench -i -s 10")
        t0 = time.monotonic()
        init = subprocess.run([pgbench, "-i", "-s", "10", "-q", "-h", pg.sock, "-p", str(pg.port), "-U", USER, DB],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if init.returncode:
            die("pgbench -i failed:\n" + init.stdout)
        say("bench: initialised in %.1f s" % (time.monotonic() - t0))

        userlist = os.path.join(work, "userlist.txt")
        with open(userlist, "w") as f:
            f.write('"%s" ""\n' % USER)
        for s in OPT.scenarios:
            if s.script:
                with open(os.path.join(work, s.script_name()), "w") as f:
                    f.write(s.script)
        if args.train:
            # Each scenario meets Sluice as in the bench: the plain ones one that offers
            # no TLS (libpq's SSLRequest answered N, as every -C connection asks), the
            # TLS scenario one that offers it. Each writes a profile; pgo.sh merges them.
            poolers["sluice"] = Pooler("sluice", args.sluice, work, runner, pg, userlist)
            tls_poolers["sluice"] = Pooler("sluice", args.sluice, work, runner, pg, userlist, tls=True)
            runner.own(OPT.profile_dir)
            poolers["sluice"].start()
            tls_poolers["sluice"].start()
            train(pgbench, pg, poolers["sluice"], tls_poolers["sluice"], work, seconds)
            return
        poolers["sluice"] = Pooler("sluice", args.sluice, work, runner, pg, userlist)
        poolers["pgbouncer"] = Pooler("pgbouncer", args.pgbouncer, work, runner, pg, userlist)
        if any(s.tls for s in OPT.scenarios):
            for name, binary in (("sluice", args.sluice), ("pgbouncer", args.pgbouncer)):
                tls_poolers[name] = Pooler(name, binary, work, runner, pg, userlist, tls=True)
        for p in list(poolers.values()) + list(tls_poolers.values()):
            p.start()
            say("bench: %s%s listening on 127.0.0.1:%d and %s (pid %d)" % (
                p.name, " (TLS)" if p.tls else "", p.port, p.sockdir, p.pid))

        raw = run_rounds(pgbench, pg, poolers, work, rounds, seconds, tls_poolers)
        agg = aggregate(raw, rounds)
        idle_rows, idle_note = run_idle_tests(pgbench, poolers, args.idle, scale_idle, nofile)

        meta = {
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "mode": "make bench-quick" if args.quick else "make bench",
            "machine": machine_text(),
            "sluice": "%s (%s)" % (version_of([args.sluice, "-V"]).replace("Sluice ", "").replace("sluice ", ""),
                                   version_of(["git", "-C", ROOT, "describe", "--always", "--dirty"])),
            "sluice_build": os.environ.get("SLUICE_BUILD") or "as given (%s)" % args.sluice,
            "pgbouncer": version_of([args.pgbouncer, "--version"]),
            "postgres": first_version_number(version_of([os.path.join(bindir, "postgres"), "--version"])),
            "run_as": "nobody" if runner.root else pwd.getpwuid(os.geteuid()).pw_name,
            "nofile": nofile, "rounds": rounds,
            "workers": ("%d (SLUICE_WORKERS)" % OPT.workers if OPT.workers is not None
                        else "its default for %d cores" % (os.cpu_count() or 1)),
            "pool_size": OPT.pool_size, "jobs": OPT.jobs, "seconds": seconds, "idle_note": idle_note,
            "tls_key": "RSA 2048" if args.tls_key == "rsa" else "ECDSA P-256",
        }
        os.makedirs(args.out, exist_ok=True)
        charted = all(k in raw for k, _ in CHART)
        md = render_markdown(meta, agg, raw, idle_rows, "clients.svg" if charted else None)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(md)
        svg = os.path.join(args.out, "clients.svg")
        if os.path.exists(svg):
            os.unlink(svg)  # not left over from an earlier run when --only leaves it out
        if charted:
            with open(svg, "w") as f:
                f.write(render_svg(agg, "pgbench -S -j %d -T %d, median of %d round(s); %s" % (
                    OPT.jobs, seconds, rounds, machine_text().split(" (")[0])))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "raw": raw, "aggregate": agg, "idle": idle_rows}, f, indent=1)
        say("")
        say(md)
        say("bench: wrote %s (%.0f s in all)" % (os.path.join(args.out, "results.md"), time.monotonic() - t_start))
    finally:
        for p in list(poolers.values()) + list(tls_poolers.values()):
            p.stop()
        pg.stop()
        if args.keep:
            say("bench: kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run_as_script(main, "bench")
