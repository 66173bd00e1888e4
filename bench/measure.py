"""Running pgbench and the idle-client tests, round after round, and the training
run for the profile-guided build."""

import glob
import json
import math
import os
import re
import resource
import subprocess
import sys
import time

from common import BENCH_DIR, MAX_CLIENT_CONN, DB, USER, TARGETS, LABEL, OPT, say, die, ENV, tail
from report import fmt_num
from servers import PoolerGroup


# --------------------------------------------------------------------------
# pgbench


def parse_pgbench(text, connect):
    r = {}
    m = re.search(r"number of transactions actually processed: (\d+)", text)
    if m:
        r["tx"] = int(m.group(1))
    m = re.search(r"latency average = ([\d.]+) ms", text)
    if m:
        r["lat_avg_ms"] = float(m.group(1))
    tps = dict((why, float(v)) for v, why in re.findall(r"^tps = ([\d.]+) \(([^)]*)\)", text, re.M))
    # With -C the figure that counts is the one including the connects (the
    # point of the scenario); otherwise the one without the initial connects.
    # Older pgbench versions word these differently.
    prefer = (["including reconnection times", "including connections establishing"] if connect else
              ["without initial connection time", "excluding connections establishing"])
    for why in prefer:
        if why in tps:
            r["tps"] = tps[why]
            break
    else:
        if tps:
            r["tps"] = next(iter(tps.values()))
    return r


def latency_from_logs(prefix):
    """Per-transaction latencies (µs) from pgbench --log files, then removed.
    Columns: client_id transaction_no time script_no time_epoch time_us ..."""
    lat = []
    for path in glob.glob(prefix + ".*"):
        with open(path) as f:
            for line in f:
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]))
        os.unlink(path)
    return lat


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    k = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[k]


def first_error(text):
    for line in text.splitlines():
        if re.search(r"error|FATAL|aborted|could not|failed", line, re.I):
            return line.strip()[:200]
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1][:200] if lines else "no output"


def children_cpu():
    """CPU seconds of the children this process has waited for (pgbench)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_pgbench(pgbench, scen, host, port, seconds, logdir, pooler, pg=None):
    prefix = os.path.join(logdir, "%s-%d" % (scen.key, time.monotonic_ns()))
    argv = [pgbench, "-n", "-c", str(scen.clients), "-j", str(OPT.jobs), "-T", str(seconds),
            "--log", "--log-prefix=" + prefix] + scen.args
    if scen.script:
        argv += ["-f", os.path.join(logdir, scen.script_name())]
    argv += ["-h", host, "-p", str(port), "-U", USER, DB]
    cpu0 = pooler.cpu() if pooler else None
    pg0 = pg.cpu() if pg else None
    bench0 = children_cpu()
    t0 = time.monotonic()
    try:
        if scen.tls:
            env = dict(ENV, PGSSLMODE="require")
        elif pooler is None:
            # PostgreSQL itself accepts TLS: plaintext asked.
            env = dict(ENV, PGSSLMODE="disable")
        else:
            env = ENV  # libpq's default, prefer: an SSLRequest, answered N
        out = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=seconds + 180)
        text, rc = out.stdout, out.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""  # bytes here whatever text= says
        text = (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\npgbench timed out"
        rc = None
    wall = time.monotonic() - t0
    bench1 = children_cpu()
    cpu1 = pooler.cpu() if pooler else None
    if pg and not pooler:
        # Direct, pgbench's backends end with it, and their CPU is read once the
        # postmaster has reaped them: read at once, it came out as low as a fifth.
        time.sleep(0.5)
    pg1 = pg.cpu() if pg else None
    lat = latency_from_logs(prefix)
    r = parse_pgbench(text, scen.connect)
    r["wall"] = round(wall, 2)
    # A non-zero exit means some client aborted (pgbench: "Run was aborted;
    # the above results are incomplete"): the figures would not be comparable.
    if rc is not None and rc < 0:
        return {"error": "pgbench killed by signal %d" % -rc, "rc": rc, "wall": round(wall, 2)}
    if rc != 0 or "tps" not in r or not r.get("tx"):
        return {"error": first_error(text) if rc != 0 or "tps" not in r else "no transactions",
                "rc": rc, "wall": round(wall, 2)}
    lat.sort()
    r["lat_p99_ms"] = percentile(lat, 0.99) / 1000.0 if lat else None
    if "lat_avg_ms" not in r and lat:
        r["lat_avg_ms"] = sum(lat) / len(lat) / 1000.0
    if pooler:
        r["cpu_s"] = round(cpu1 - cpu0, 3)
        r["cpu_per_10k"] = (cpu1 - cpu0) / r["tx"] * 10000
    # The rest of the machine's work: pgbench itself, and PostgreSQL.
    r["pgbench_per_10k"] = (bench1 - bench0) / r["tx"] * 10000
    if pg0 is not None and pg1 is not None:
        r["postgres_per_10k"] = (pg1 - pg0) / r["tx"] * 10000
        r["all_per_10k"] = r["pgbench_per_10k"] + r["postgres_per_10k"] + r.get("cpu_per_10k", 0)
    return r


# --------------------------------------------------------------------------
# idle clients


def idle_clients(pooler, total, sources, deadline, workers_per_source=1, login_timeout=20):
    """Opens `total` idle logged-in clients to the pooler from worker
    processes (bench/idle_clients.py) and measures the pooler's RSS."""
    n_workers = len(sources) * workers_per_source
    per = [total // n_workers + (1 if i < total % n_workers else 0) for i in range(n_workers)]
    rss0 = pooler.rss_kb()
    cpu0 = pooler.cpu()
    procs = []
    t0 = time.monotonic()
    try:
        for i, count in enumerate(per):
            src = sources[i % len(sources)]
            argv = [sys.executable, os.path.join(BENCH_DIR, "idle_clients.py"),
                    "--port", str(pooler.port), "--count", str(count), "--database", DB,
                    "--user", USER, "--deadline", str(deadline), "--login-timeout", str(login_timeout)]
            if src:
                argv += ["--source", src]
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True, env=ENV))
        reports = []
        for p in procs:
            line = p.stdout.readline()
            if not line.startswith("READY "):
                reports.append({"ok": 0, "errors": {"client worker failed": per[procs.index(p)]}})
            else:
                reports.append(json.loads(line[6:]))
        open_s = time.monotonic() - t0
        time.sleep(1.0)  # let the pooler finish any per-client work after ReadyForQuery
        rss1 = pooler.rss_kb() if pooler.alive() else None
        cpu1 = pooler.cpu() if pooler.alive() else None
        alive = 0
        for p in procs:
            try:
                p.stdin.write("check\n")
                p.stdin.flush()
                line = p.stdout.readline()
                alive += json.loads(line[6:])["alive"] if line.startswith("CHECK ") else 0
            except (BrokenPipeError, ValueError):
                pass
    finally:
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    ok = sum(r["ok"] for r in reports)
    errors = {}
    for r in reports:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    res = {"requested": total, "accepted": ok, "errors": errors, "still_connected": alive,
           "rss_before_kb": rss0, "rss_after_kb": rss1, "open_s": round(open_s, 2),
           "pooler_alive": pooler.alive()}
    if rss1 is not None and ok:
        res["kb_per_client"] = (rss1 - rss0) / ok
    if cpu1 is not None:
        res["login_cpu_s"] = round(cpu1 - cpu0, 2)
    return res


# --------------------------------------------------------------------------
# the two phases


def run_rounds(pgbench, pg, poolers, work, rounds, seconds, tls_poolers=None):
    """Every scenario against Sluice, PgBouncer and PostgreSQL, `rounds` times,
    interleaved so that a slow stretch of the machine hits all three alike; a TLS
    scenario against `tls_poolers`, which offer TLS.
    Returns {scenario key: {target: [one result per round]}}."""
    raw = {s.key: {t: [] for t in TARGETS} for s in OPT.scenarios}
    total_runs = rounds * len(OPT.scenarios) * len(TARGETS)
    n = 0
    t_runs = time.monotonic()
    for rnd in range(1, rounds + 1):
        for scen in OPT.scenarios:
            for t in TARGETS:
                n += 1
                pooler = (tls_poolers if scen.tls else poolers).get(t)
                if not pg.alive():
                    # Nothing after this could measure anything; stopping
                    # now beats minutes of login timeouts in the poolers.
                    die("PostgreSQL is gone (stopped from outside?); log tail:\n" + tail(pg.logfile))
                if pooler is not None and not pooler.alive():
                    # A crashed pooler is restarted so one failure does not
                    # void every later scenario; the run is recorded as failed.
                    say("bench: %s is not running; restarting it. Log tail:\n%s" % (t, tail(pooler.logfile)))
                    pooler.start()
                if t == "direct":
                    host = pg.sock if scen.via == "unix" else "127.0.0.1"
                    port = pg.port
                else:
                    host = pooler.sockdir if scen.via == "unix" else "127.0.0.1"
                    port = pooler.port
                if scen.writes:
                    pg.reset_tables()
                r = run_pgbench(pgbench, scen, host, port, seconds, work, pooler, pg)
                if pooler is not None and not pooler.alive():
                    r = {"error": "%s exited during the run" % t, "wall": r.get("wall")}
                raw[scen.key][t].append(r)
                eta = (time.monotonic() - t_runs) / n * (total_runs - n)
                if "error" in r:
                    what = "FAILED: " + r["error"]
                else:
                    what = "%9s tps  avg %6.2f ms  p99 %6.2f ms%s" % (
                        fmt_num(r["tps"]), r.get("lat_avg_ms") or 0, r.get("lat_p99_ms") or 0,
                        "  cpu %.3f s/10k tx" % r["cpu_per_10k"] if "cpu_per_10k" in r else "")
                say("[%3d/%d] round %d/%d  %-48s %-10s %s  (%.0fs, ~%.0fs of runs left)" % (
                    n, total_runs, rnd, rounds, scen.title, LABEL[t], what, r.get("wall") or 0, eta))
    return raw


def run_idle_tests(pgbench, poolers, idle, scale_idle, nofile):
    """The idle-client tests, each on freshly restarted poolers. Returns the
    table rows and a note for when the open-files limit caps the scale test."""
    idle_rows = []
    idle_note = ""
    tests = []
    if idle:
        # Four client processes (the client side is Python), default source address.
        tests.append(dict(count=idle, max_client_conn=MAX_CLIENT_CONN, sources=[None],
                          workers_per_source=4, deadline=120, login_timeout=20))
    if scale_idle:
        # Five source addresses so the client side does not run out of
        # ephemeral ports (about 28k per source address and destination).
        # A short login timeout: at a descriptor limit, logins stall rather than fail.
        # Where one process may not hold that many sockets, each pooler runs as
        # several processes sharing the port (so_reuseport), each kept a tenth under
        # the limit (the kernel's spread is even only on average).
        per_process = max(nofile - 1000, 1000)
        processes = 1 if nofile >= scale_idle + 1000 else -(-scale_idle * 11 // (per_process * 10))
        tests.append(dict(count=scale_idle, max_client_conn=scale_idle + 1000,
                          sources=["127.0.0.%d" % i for i in range(1, 6)],
                          workers_per_source=1, deadline=120, login_timeout=10,
                          processes=processes))
        if processes > 1:
            idle_note = ("For %s clients, each pooler ran as %d processes on one port with "
                         "`so_reuseport` (the kernel spreads the connections over them), because "
                         "one process may hold at most %d open files here (the hard limit, which "
                         "this run could not raise); its RSS is the sum over the processes."
                         % (fmt_num(scale_idle), processes, nofile))
    for test in tests:
        count = test["count"]
        processes = test.get("processes", 1)
        for name in ("sluice", "pgbouncer"):
            p = poolers[name] if processes == 1 else PoolerGroup(poolers[name], processes)
            # A fresh process, so the heap left by the pgbench runs does not
            # absorb (and hide) the memory the idle clients cost.
            poolers[name].stop()
            try:
                p.start(max_client_conn=test["max_client_conn"])
                p.warm_up(pgbench)
                time.sleep(0.5)
                say("bench: %s idle clients -> %s%s ..." % (
                    fmt_num(count), LABEL[name],
                    " (%d processes, so_reuseport)" % processes if processes > 1 else ""))
                res = idle_clients(p, count, test["sources"], test["deadline"],
                                   test["workers_per_source"], test["login_timeout"])
            finally:
                if processes > 1:
                    p.stop()
            res["processes"] = processes
            idle_rows.append({"count": count, "pooler": name, "result": res})
            say("bench:   logged in %s, still connected %s, errors %s, RSS %.1f -> %s MB, %s KB/client, %.1f s"
                % (fmt_num(res["accepted"]), fmt_num(res["still_connected"]), res["errors"] or "none",
                   res["rss_before_kb"] / 1024,
                   "-" if res["rss_after_kb"] is None else "%.1f" % (res["rss_after_kb"] / 1024),
                   fmt_num(res.get("kb_per_client"), 2), res["open_s"]))
            if not res["pooler_alive"]:
                say("bench:   %s exited; log tail:\n%s" % (name, tail(p.logfile)))
    return idle_rows, idle_note


def train(pgbench, pg, plain, tls, work, seconds):
    """--train: every scenario once against instrumented Sluices (a
    -Cprofile-generate build), which write their profiles when they exit; the
    profile-guided build (bench/pgo.sh) is then optimised for these paths. As in
    the bench, the TLS scenario goes to `tls`, which offers TLS, and the others to
    `plain`, with libpq's default sslmode: each new connection's SSLRequest is
    answered N, the path every `-C` transaction takes (trained with plaintext asked
    instead, that path was left out of the profile)."""
    for scen in OPT.scenarios:
        sluice = tls if scen.tls else plain
        host = sluice.sockdir if scen.via == "unix" else "127.0.0.1"
        r = run_pgbench(pgbench, scen, host, sluice.port, seconds, work, sluice)
        if "error" in r:
            die("training run %s failed: %s" % (scen.key, r["error"]))
        say("bench: trained on %-48s %9s tps" % (scen.title, fmt_num(r["tps"])))
    plain.stop()
    tls.stop()
    written = glob.glob(os.path.join(OPT.profile_dir, "sluice-*.profraw"))
    if not written:
        die("the instrumented Sluice wrote no profile in %s (was it built with "
            "-Cprofile-generate?); log tail:\n%s" % (OPT.profile_dir, tail(sluice.logfile)))
    say("bench: profile written: %s" % ", ".join(written))
