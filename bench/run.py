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
import glob
import json
import math
import os
import platform
import pwd
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "bench")
CLK_TCK = os.sysconf("SC_CLK_TCK")

POOL_SIZE = 4
MAX_CLIENT_CONN = 11000
JOBS = 2
SLUICE_WORKERS = None  # None: Sluice picks by core count
PROFILE_DIR = None  # --train: where the instrumented Sluice writes its profile
DB = "bench"
USER = "postgres"
TARGETS = ("sluice", "pgbouncer", "direct")
LABEL = {"sluice": "Sluice", "pgbouncer": "PgBouncer", "direct": "PostgreSQL"}


class Scenario:
    def __init__(self, key, title, clients, args, via="tcp", connect=False, script=None):
        self.key = key
        self.title = title
        self.clients = clients
        self.args = args          # pgbench arguments besides -c/-j/-T/--log
        self.via = via            # "tcp" or "unix"
        self.connect = connect    # -C: a new connection per transaction
        self.script = script      # custom script text for -f, or None

    def describe(self):
        a = ["-c %d" % self.clients, "-j %d" % JOBS] + self.args
        if self.script:
            a.append("-f %s" % self.script_name())
        if self.via == "unix":
            a.append("(UNIX socket)")
        return "pgbench " + " ".join(a)

    def script_name(self):
        return self.key + ".sql"


SELECT1 = "SELECT 1;\n"
# In run order within a round. -M prepared comes last: if a pooler fails it,
# whatever state the failure leaves on its server connections cannot affect
# the other scenarios of the round.
SCENARIOS = [
    Scenario("select_8", "select-only (-S), 8 clients", 8, ["-S"]),
    Scenario("select1_tcp", "SELECT 1, 8 clients, TCP", 8, [], script=SELECT1),
    Scenario("select1_unix", "SELECT 1, 8 clients, UNIX socket", 8, [], via="unix", script=SELECT1),
    Scenario("select1_connect", "SELECT 1, new connection per tx (-C), 8 clients", 8, ["-C"],
             connect=True, script=SELECT1),
    Scenario("select_64", "select-only, 64 clients", 64, ["-S"]),
    Scenario("select_256", "select-only, 256 clients", 256, ["-S"]),
    Scenario("select_600", "select-only, 600 clients", 600, ["-S"]),
    Scenario("tpcb_32", "TPC-B-like (default script), 32 clients", 32, []),
    Scenario("extended_8", "select-only -M extended, 8 clients", 8, ["-S", "-M", "extended"]),
    Scenario("prepared_8", "select-only -M prepared, 8 clients", 8, ["-S", "-M", "prepared"]),
]
# Not in the default set; for machines with cores to spare (`--only`): the
# pooler's own ceiling, with enough clients to keep a larger pool busy.
EXTRA_SCENARIOS = [
    Scenario("select1_64", "SELECT 1, 64 clients, TCP", 64, [], script=SELECT1),
    Scenario("select1_256", "SELECT 1, 256 clients, TCP", 256, [], script=SELECT1),
]
CHART = [("select_8", 8), ("select_64", 64), ("select_256", 256), ("select_600", 600)]


def say(msg):
    print(msg, flush=True)


def die(msg):
    raise SystemExit("bench: " + msg)


# --------------------------------------------------------------------------
# environment


def pg_bindir():
    cands = []
    try:
        cands.append(subprocess.check_output(["pg_config", "--bindir"], text=True,
                                             stderr=subprocess.DEVNULL).strip())
    except (OSError, subprocess.CalledProcessError):
        pass

    def version_key(path):
        # /usr/lib/postgresql/15/bin -> 15, newest first
        m = re.search(r"/(\d+)/bin$", path)
        return int(m.group(1)) if m else 0

    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version_key, reverse=True)
    for d in cands:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    die("PostgreSQL server binaries not found; run 'make deps'")


def which(name, extra=()):
    for d in list(extra) + os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK) and not os.path.isdir(p):
            return p
    return None


def clean_env():
    # The ambient libpq environment (PGHOST, PGPASSWORD, ...) must not steer
    # any client or server started here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


ENV = clean_env()


def raise_fd_limit(want=65536):
    """Raises the open-files limit, inherited by every process started here.
    PgBouncer wants more descriptors than max_client_conn, and the 50,000
    idle-client test needs 50,000 in the pooler. The soft limit can always go up
    to the hard one; root may raise the hard one too, except where it lacks
    CAP_SYS_RESOURCE (many containers). Returns the resulting limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        except (ValueError, OSError):
            pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port():
    """A TCP port on 127.0.0.1 nothing listens on. Never 6432, PgBouncer's
    default, where a packaged pgbouncer service may be running."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 6432:
            return port


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def proc_cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        # The command name is in parentheses and may contain spaces: split after it.
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Runner:
    """Runs the servers as `nobody` when we are root: PostgreSQL and PgBouncer
    refuse to run as root, and Sluice runs as the same user for fairness."""

    def __init__(self):
        self.root = os.geteuid() == 0
        if self.root:
            pw = pwd.getpwnam("nobody")
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
            setpriv = which("setpriv")
            if not setpriv:
                die("setpriv (util-linux) not found; needed to run servers as nobody")
            # setpriv execs in place (runuser forks), so the pid we get is the server's.
            self.prefix = [setpriv, "--reuid=%d" % self.uid, "--regid=%d" % self.gid, "--clear-groups"]
        else:
            self.prefix = []

    def own(self, path):
        if self.root:
            os.chown(path, self.uid, self.gid)

    def cmd(self, argv):
        return self.prefix + argv


# --------------------------------------------------------------------------
# PostgreSQL


class Postgres:
    def __init__(self, work, runner, bindir):
        self.work = work
        self.runner = runner
        self.bindir = bindir
        self.data = os.path.join(work, "pgdata")
        self.sock = os.path.join(work, "pgsock")
        self.logfile = os.path.join(work, "postgres.log")
        self.port = None
        self.started = False

    def start(self):
        os.mkdir(self.sock)
        self.runner.own(self.sock)
        out = subprocess.run(self.runner.cmd([
            os.path.join(self.bindir, "initdb"), "-D", self.data, "-A", "trust", "-U", USER,
            "--no-sync", "-E", "UTF8", "--locale=C"]),
            cwd=self.work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if out.returncode:
            die("initdb failed:\n" + out.stdout)
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\n# bench/run.py\n"
                    "listen_addresses = '127.0.0.1'\n"
                    "unix_socket_directories = '%s'\n"
                    "max_connections = 700\n"
                    "fsync = off\n"
                    "synchronous_commit = off\n"
                    "full_page_writes = off\n"
                    "shared_buffers = 128MB\n" % self.sock)
        for _ in range(3):
            port = free_port()
            rc = subprocess.run(self.runner.cmd([
                os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.logfile, "-w",
                "-t", "60", "-o", "-p %d" % port, "start"]),
                cwd=self.work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            if rc == 0:
                self.port = port
                self.started = True
                return
        die("could not start PostgreSQL:\n" + tail(self.logfile, 30))

    def alive(self):
        """The postmaster is up (its pid file names a live process) and accepts."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                os.kill(int(f.readline()), 0)
        except (OSError, ValueError):
            return False
        return port_open(self.port)

    def stop(self):
        if self.started:
            subprocess.run(self.runner.cmd([
                os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w", "stop"]),
                cwd=self.work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.started = False


# --------------------------------------------------------------------------
# poolers


class Pooler:
    """A Sluice or a PgBouncer with the same ini (both read pgbouncer.ini)."""

    def __init__(self, name, binary, work, runner, pg, userlist, instance=0):
        self.name = name
        self.binary = binary
        self.work = work
        self.dir = os.path.join(work, "%s.%d" % (name, instance) if instance else name)
        self.runner = runner
        self.pg = pg
        self.userlist = userlist
        self.port = None
        self.proc = None
        self.pid = None
        self.so_reuseport = False
        os.mkdir(self.dir)
        # The pooler writes its log, pid file and socket here as nobody.
        self.runner.own(self.dir)
        self.ini = os.path.join(self.dir, name + ".ini")
        self.logfile = os.path.join(self.dir, name + ".log")
        self.pidfile = os.path.join(self.dir, name + ".pid")
        self.outfile = os.path.join(self.dir, name + ".out")

    @property
    def sockdir(self):
        return self.dir

    def write_ini(self, max_client_conn):
        with open(self.ini, "w") as f:
            f.write(f"""[databases]
{DB} = host={self.pg.sock} port={self.pg.port} dbname={DB}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir = {self.dir}
auth_type = trust
auth_file = {self.userlist}
logfile = {self.logfile}
pidfile = {self.pidfile}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = {max_client_conn}
; Same for both: a backlog deep enough for thousands of connects at once, and
; no log line per connection (PgBouncer's default logs two per -C transaction).
listen_backlog = 4096
log_connections = 0
log_disconnections = 0
""")
            if self.so_reuseport:
                f.write("so_reuseport = 1\n")

    def start(self, max_client_conn=MAX_CLIENT_CONN, port=None):
        self.port = port or free_port()
        self.write_ini(max_client_conn)
        if os.path.exists(self.pidfile):
            os.unlink(self.pidfile)  # Sluice refuses a pid file naming a live process
        with open(self.outfile, "ab") as out:
            # Own session: a Ctrl-C at the terminal reaches only this driver,
            # which then stops the poolers itself, in order.
            env = dict(ENV)
            if self.name == "sluice" and SLUICE_WORKERS is not None:
                env["SLUICE_WORKERS"] = str(SLUICE_WORKERS)
            if self.name == "sluice" and PROFILE_DIR:
                # An instrumented build (--train) writes its profile here at exit.
                env["LLVM_PROFILE_FILE"] = os.path.join(PROFILE_DIR, "sluice-%p.profraw")
            self.proc = subprocess.Popen(self.runner.cmd([self.binary, self.ini]), cwd=self.dir,
                                         env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc, self.proc = self.proc.returncode, None
                die("%s exited at startup (rc %s):\n%s%s" % (
                    self.name, rc, tail(self.outfile), tail(self.logfile)))
            if port_open(self.port) and os.path.exists(os.path.join(self.dir, ".s.PGSQL.%d" % self.port)):
                return
            time.sleep(0.1)
        die("%s did not start listening on 127.0.0.1:%d:\n%s" % (self.name, self.port, tail(self.logfile)))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM: PgBouncer shuts down at once; Sluice waits for clients,
            # of which there are none left by now. SIGKILL if either lingers.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cpu(self):
        return proc_cpu_seconds(self.pid)

    def rss_kb(self):
        return proc_rss_kb(self.pid)

    def warm_up(self, pgbench):
        """One short pgbench run through the UNIX socket (so this process, whatever
        the kernel does with TCP), so that the pool has its server connection and
        server parameters before a baseline is taken."""
        subprocess.run([pgbench, "-n", "-S", "-c", "1", "-t", "10", "-h", self.sockdir, "-p",
                        str(self.port), "-U", USER, DB], env=ENV, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)


class PoolerGroup:
    """Several processes of one pooler on one TCP port with `so_reuseport`, the kernel
    spreading new connections over them (each has its own directory, so its own
    UNIX socket, log and pid file): the idle scale test, where one process may not
    hold as many sockets as there are clients. Measured as one: RSS and CPU are
    the sums over the processes."""

    def __init__(self, first, count):
        self.members = [first] + [Pooler(first.name, first.binary, first.work, first.runner,
                                         first.pg, first.userlist, instance=i)
                                  for i in range(2, count + 1)]
        self.name = first.name

    @property
    def port(self):
        return self.members[0].port

    @property
    def logfile(self):
        return self.members[0].logfile

    def start(self, max_client_conn):
        for m in self.members:
            m.so_reuseport = True
        self.members[0].start(max_client_conn=max_client_conn)
        for m in self.members[1:]:
            m.start(max_client_conn=max_client_conn, port=self.port)

    def stop(self):
        for m in self.members:
            m.stop()
            m.so_reuseport = False

    def warm_up(self, pgbench):
        for m in self.members:
            m.warm_up(pgbench)

    def alive(self):
        return all(m.alive() for m in self.members)

    def cpu(self):
        return sum(m.cpu() for m in self.members)

    def rss_kb(self):
        return sum(m.rss_kb() for m in self.members)


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


def run_pgbench(pgbench, scen, host, port, seconds, logdir, pooler):
    prefix = os.path.join(logdir, "%s-%d" % (scen.key, time.monotonic_ns()))
    argv = [pgbench, "-n", "-c", str(scen.clients), "-j", str(JOBS), "-T", str(seconds),
            "--log", "--log-prefix=" + prefix] + scen.args
    if scen.script:
        argv += ["-f", os.path.join(logdir, scen.script_name())]
    argv += ["-h", host, "-p", str(port), "-U", USER, DB]
    cpu0 = pooler.cpu() if pooler else None
    t0 = time.monotonic()
    try:
        out = subprocess.run(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=seconds + 180)
        text, rc = out.stdout, out.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""  # bytes here whatever text= says
        text = (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\npgbench timed out"
        rc = None
    wall = time.monotonic() - t0
    cpu1 = pooler.cpu() if pooler else None
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
    for scen in SCENARIOS:
        agg[scen.key] = {}
        for t in TARGETS:
            runs = raw.get(scen.key, {}).get(t, [])
            good = [r for r in runs if "error" not in r]
            a = {"ok_rounds": len(good), "rounds": len(runs),
                 "errors": [r["error"] for r in runs if "error" in r]}
            for f in ("tps", "lat_avg_ms", "lat_p99_ms", "cpu_per_10k"):
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


def render_markdown(meta, agg, idle, chart_name):
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
             % (POOL_SIZE, MAX_CLIENT_CONN, meta["run_as"], meta["nofile"]))
    L.append("- pgbench `-j %d -T %s`, %d round(s), interleaved Sluice, PgBouncer, direct; "
             "each figure is the median over the rounds." % (JOBS, meta["seconds"], meta["rounds"]))
    L.append("- Sluice's worker threads: %s." % meta["workers"])
    L.append("")
    L.append("| scenario | Sluice tps | PgBouncer tps | direct tps | Sluice/direct | Sluice/PgBouncer "
             "| avg latency ms (S / B / D) | p99 latency ms (S / B / D) "
             "| CPU s per 10k tx Sluice | CPU s per 10k tx PgBouncer | CPU Sluice/PgBouncer |")
    L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for scen in SCENARIOS:
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
    fails = []
    for scen in SCENARIOS:
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
    for scen in SCENARIOS:
        L.append("- %s: `%s`%s" % (scen.title, scen.describe(),
                                   " with `%s`" % scen.script.strip() if scen.script else ""))
    L.append("")
    if chart_name:
        L.append("![tps by client count](%s)" % chart_name)
    L.append("")
    return "\n".join(L)


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
         '(pool of %d server connections)</text>' % (left, POOL_SIZE),
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
# the two phases


def run_rounds(pgbench, pg, poolers, work, rounds, seconds):
    """Every scenario against Sluice, PgBouncer and PostgreSQL, `rounds` times,
    interleaved so that a slow stretch of the machine hits all three alike.
    Returns {scenario key: {target: [one result per round]}}."""
    raw = {s.key: {t: [] for t in TARGETS} for s in SCENARIOS}
    total_runs = rounds * len(SCENARIOS) * len(TARGETS)
    n = 0
    t_runs = time.monotonic()
    for rnd in range(1, rounds + 1):
        for scen in SCENARIOS:
            for t in TARGETS:
                n += 1
                pooler = poolers.get(t)
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
                r = run_pgbench(pgbench, scen, host, port, seconds, work, pooler)
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


def train(pgbench, pg, sluice, work, seconds):
    """--train: every scenario once against an instrumented Sluice (a
    -Cprofile-generate build), which writes its profile when it exits; the
    profile-guided build (bench/pgo.sh) is then optimised for these paths."""
    for scen in SCENARIOS:
        host = sluice.sockdir if scen.via == "unix" else "127.0.0.1"
        r = run_pgbench(pgbench, scen, host, sluice.port, seconds, work, None)
        if "error" in r:
            die("training run %s failed: %s" % (scen.key, r["error"]))
        say("bench: trained on %-48s %9s tps" % (scen.title, fmt_num(r["tps"])))
    sluice.stop()
    written = glob.glob(os.path.join(PROFILE_DIR, "sluice-*.profraw"))
    if not written:
        die("the instrumented Sluice wrote no profile in %s (was it built with "
            "-Cprofile-generate?); log tail:\n%s" % (PROFILE_DIR, tail(sluice.logfile)))
    say("bench: profile written: %s" % ", ".join(written))


def main():
    global SCENARIOS, POOL_SIZE, JOBS, SLUICE_WORKERS, PROFILE_DIR
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
    ap.add_argument("--pool-size", type=int, default=POOL_SIZE,
                    help="default_pool_size of both poolers (default %d)" % POOL_SIZE)
    ap.add_argument("--jobs", type=int, default=JOBS, help="pgbench -j (default %d)" % JOBS)
    ap.add_argument("--workers", type=int,
                    help="Sluice's worker threads (SLUICE_WORKERS; default: its own choice by cores)")
    ap.add_argument("--train", metavar="DIR",
                    help="only run each scenario once against an instrumented Sluice, "
                         "which writes its profile into DIR (bench/pgo.sh)")
    args = ap.parse_args()
    POOL_SIZE, JOBS, SLUICE_WORKERS = args.pool_size, args.jobs, args.workers
    if args.train:
        PROFILE_DIR = os.path.abspath(args.train)
        os.makedirs(PROFILE_DIR, exist_ok=True)
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
        SCENARIOS = [s for s in known if s.key in keys]
    too_few = [s.key for s in SCENARIOS if s.clients < JOBS]
    if too_few:
        die("pgbench -j %d needs at least as many clients; fewer in %s" % (JOBS, ", ".join(too_few)))

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
    pg = Postgres(work, runner, bindir)
    poolers = {}
    t_start = time.monotonic()
    try:
        if args.train:
            say("bench: work dir %s; training: %d scenario(s) once through Sluice, -T %d"
                % (work, len(SCENARIOS), seconds))
        else:
            say("bench: work dir %s; %d round(s) x %d scenario(s) x 3 targets, -T %d"
                % (work, rounds, len(SCENARIOS), seconds))
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
        for s in SCENARIOS:
            if s.script:
                with open(os.path.join(work, s.script_name()), "w") as f:
                    f.write(s.script)
        poolers["sluice"] = Pooler("sluice", args.sluice, work, runner, pg, userlist)
        if args.train:
            runner.own(PROFILE_DIR)
            poolers["sluice"].start()
            train(pgbench, pg, poolers["sluice"], work, seconds)
            return
        poolers["pgbouncer"] = Pooler("pgbouncer", args.pgbouncer, work, runner, pg, userlist)
        for p in poolers.values():
            p.start()
            say("bench: %s listening on 127.0.0.1:%d and %s (pid %d)" % (p.name, p.port, p.sockdir, p.pid))

        raw = run_rounds(pgbench, pg, poolers, work, rounds, seconds)
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
            "workers": ("%d (SLUICE_WORKERS)" % SLUICE_WORKERS if SLUICE_WORKERS is not None
                        else "its default for %d cores" % (os.cpu_count() or 1)),
            "pool_size": POOL_SIZE, "jobs": JOBS, "seconds": seconds, "idle_note": idle_note,
        }
        os.makedirs(args.out, exist_ok=True)
        charted = all(k in raw for k, _ in CHART)
        md = render_markdown(meta, agg, idle_rows, "clients.svg" if charted else None)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(md)
        svg = os.path.join(args.out, "clients.svg")
        if os.path.exists(svg):
            os.unlink(svg)  # not left over from an earlier run when --only leaves it out
        if charted:
            with open(svg, "w") as f:
                f.write(render_svg(agg, "pgbench -S -j %d -T %d, median of %d round(s); %s" % (
                    JOBS, seconds, rounds, machine_text().split(" (")[0])))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "raw": raw, "aggregate": agg, "idle": idle_rows}, f, indent=1)
        say("")
        say(md)
        say("bench: wrote %s (%.0f s in all)" % (os.path.join(args.out, "results.md"), time.monotonic() - t_start))
    finally:
        for p in poolers.values():
            p.stop()
        pg.stop()
        if args.keep:
            say("bench: kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def on_signal(signum, _frame):
    # Turn SIGTERM/SIGHUP into an exception so that the finally blocks stop
    # every process this run started (as the EXIT trap of a shell script would).
    print("bench: signal %d, stopping everything" % signum, file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
