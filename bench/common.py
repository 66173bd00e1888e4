"""Shared by the bench's modules: constants, the scenarios, the run's options,
messages, and small helpers about the environment and processes."""

import glob
import os
import re
import resource
import signal
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH_DIR = os.path.join(ROOT, "bench")
CLK_TCK = os.sysconf("SC_CLK_TCK")

MAX_CLIENT_CONN = 11000
DB = "bench"
USER = "postgres"
TARGETS = ("sluice", "pgbouncer", "direct")
LABEL = {"sluice": "Sluice", "pgbouncer": "PgBouncer", "direct": "PostgreSQL"}


class Scenario:
    def __init__(self, key, title, clients, args, via="tcp", connect=False, script=None, tls=False,
                 writes=False):
        self.key = key
        self.title = title
        self.clients = clients
        self.args = args          # pgbench arguments besides -c/-j/-T/--log
        self.via = via            # "tcp" or "unix"
        self.connect = connect    # -C: a new connection per transaction
        self.script = script      # custom script text for -f, or None
        self.tls = tls            # sslmode=require, to poolers that offer TLS (servers.py)
        # Updates pgbench's tables: each run starts from the same tables
        # (Postgres.reset_tables), as pgbench's own pre-run vacuum does.
        self.writes = writes

    def describe(self):
        a = ["-c %d" % self.clients, "-j %d" % OPT.jobs] + self.args
        if self.script:
            a.append("-f %s" % self.script_name())
        if self.via == "unix":
            a.append("(UNIX socket)")
        if self.tls:
            a.append("(PGSSLMODE=require)")
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
    # Clients over TLS: both poolers and PostgreSQL accept it with the same key and
    # certificate (every other scenario's clients ask for plaintext).
    Scenario("select1_tls", "SELECT 1, 8 clients, TCP with TLS", 8, [], script=SELECT1, tls=True),
    Scenario("select1_connect", "SELECT 1, new connection per tx (-C), 8 clients", 8, ["-C"],
             connect=True, script=SELECT1),
    Scenario("select_64", "select-only, 64 clients", 64, ["-S"]),
    Scenario("select_256", "select-only, 256 clients", 256, ["-S"]),
    Scenario("select_600", "select-only, 600 clients", 600, ["-S"]),
    Scenario("tpcb_32", "TPC-B-like (default script), 32 clients", 32, [], writes=True),
    Scenario("extended_8", "select-only -M extended, 8 clients", 8, ["-S", "-M", "extended"]),
    Scenario("prepared_8", "select-only -M prepared, 8 clients", 8, ["-S", "-M", "prepared"]),
]
# Not in the default set; for machines with cores to spare (`--only`): the
# pooler's own ceiling, with enough clients to keep a larger pool busy.
EXTRA_SCENARIOS = [
    Scenario("select1_64", "SELECT 1, 64 clients, TCP", 64, [], script=SELECT1),
    Scenario("select1_256", "SELECT 1, 256 clients, TCP", 256, [], script=SELECT1),
    # Many clients on the extended protocol, as most drivers' queries with parameters
    # send it: requests go behind others there too (docs/performance.md, sixty-second
    # round).
    Scenario("extended_256", "select-only -M extended, 256 clients", 256,
             ["-S", "-M", "extended"]),
    # The same with named prepared statements, as drivers' statement caches send
    # them: rewritten in line and behind others (docs/performance.md, sixty-sixth
    # round). PgBouncer 1.18 does not follow them in transaction pooling; it runs
    # this only because every client prepares the same text under the same name,
    # and fails a round now and then ("already exists").
    Scenario("prepared_256", "select-only -M prepared, 256 clients", 256,
             ["-S", "-M", "prepared"]),
    # An application's pool: many clients, each sending every ~3 s (-R 150 over 500),
    # so idle past the 2 s after which Sluice first puts a client to sleep. Run it
    # with --seconds 60 or more: the sleep policy settles in the first ~30 s
    # (docs/performance.md, twenty-ninth round).
    Scenario("sporadic_500", "select-only, 500 clients sending every ~3 s (-R 150)", 500,
             ["-S", "-R", "150"]),
    # A new TLS connection per transaction: what a TLS login costs, the signature of
    # the key most of it (--tls-key rsa for an RSA 2048 key; docs/performance.md,
    # fifty-seventh round).
    Scenario("tls_connect", "SELECT 1, new TLS connection per tx (-C), 8 clients", 8, ["-C"],
             connect=True, script=SELECT1, tls=True),
]
CHART = [("select_8", 8), ("select_64", 64), ("select_256", 256), ("select_600", 600)]


class Options:
    """What the command line sets for the whole run (run.py's main)."""

    def __init__(self):
        self.pool_size = 4
        self.jobs = 2
        self.workers = None  # None: Sluice picks by core count
        self.profile_dir = None  # --train: where the instrumented Sluice writes its profile
        self.scenarios = list(SCENARIOS)  # the ones to run


OPT = Options()


def say(msg):
    print(msg, flush=True)


def die(msg):
    raise SystemExit("bench: " + msg)


# --------------------------------------------------------------------------
# environment


def pg_bindir():
    cands = [os.environ["BENCH_PG_BINDIR"]] if os.environ.get("BENCH_PG_BINDIR") else []
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


def proc_stat(pid):
    """/proc/PID/stat's fields from the third (state) on: fields[1] is the parent's
    pid; fields[11..14] are utime, stime, cutime and cstime, in clock ticks."""
    with open("/proc/%d/stat" % pid) as f:
        # The command name is in parentheses and may contain spaces: split after it.
        return f.read().rsplit(")", 1)[1].split()


def proc_cpu_seconds(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid):
    """utime + stime of a process, of the children it has waited for, and of its live
    children: PostgreSQL's postmaster and its backends, those that ended included."""
    total = sum(int(v) for v in proc_stat(pid)[11:15])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = proc_stat(int(entry))
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(f[1]) == pid:
            total += int(f[11]) + int(f[12])
    return total / CLK_TCK


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


def run_as_script(main, name):
    """Runs a driver's `main`, turning SIGTERM/SIGHUP into an exception so that its
    finally blocks stop every process it started (as the EXIT trap of a shell script
    would), and Ctrl-C into exit status 130."""
    def on_signal(signum, _frame):
        print("%s: signal %d, stopping everything" % (name, signum), file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
