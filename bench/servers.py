"""The servers a run starts: PostgreSQL, and each pooler (alone or as a group of
`so_reuseport` processes), run as `nobody` when the bench runs as root."""

import os
import pwd
import signal
import subprocess
import time

from common import (
    MAX_CLIENT_CONN, DB, USER, OPT, die, which, ENV, free_port, port_open, proc_cpu_seconds,
    proc_rss_kb, tail, tree_cpu_seconds,
)


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
# TLS


class TlsFiles:
    """A self-signed key and certificate for localhost, made with openssl, readable
    by the servers' user only (PostgreSQL insists): PostgreSQL and both poolers
    present it to the TLS scenario's clients, which do not verify it
    (sslmode=require), so all three do the same TLS work. `kind` is "ecdsa" (P-256,
    the default) or "rsa" (2048 bits)."""

    def __init__(self, work, runner, kind="ecdsa"):
        openssl = which("openssl") or die("openssl not found; run bench/install-deps.sh")
        self.key = os.path.join(work, "tls.key")
        self.cert = os.path.join(work, "tls.crt")
        key = (["-newkey", "rsa:2048"] if kind == "rsa" else
               ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        out = subprocess.run([openssl, "req", "-x509"] + key + ["-nodes", "-days", "2",
                              "-subj", "/CN=localhost", "-keyout", self.key, "-out", self.cert],
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if out.returncode:
            die("openssl could not make the TLS key:\n" + out.stdout)
        for f in (self.key, self.cert):
            os.chmod(f, 0o600)
            runner.own(f)


# --------------------------------------------------------------------------
# PostgreSQL


class Postgres:
    def __init__(self, work, runner, bindir, tls=None):
        self.tls = tls  # TlsFiles, or None: no TLS anywhere
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
            if self.tls:
                f.write("ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n"
                        % (self.tls.cert, self.tls.key))
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

    def reset_tables(self):
        """What pgbench does before a run when told `-v` (the bench's runs are
        told `-n`, so that no pooler has to carry it), plus a checkpoint: each
        run that updates the tables starts from the same state whichever target
        it measures, not on the dead rows its predecessors left. Straight to
        PostgreSQL, outside the measured time."""
        psql = which("psql", [self.bindir]) or die("psql not found; run 'make deps'")
        out = subprocess.run(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", self.sock, "-p", str(self.port), "-U", USER,
             "-d", DB, "-c", "VACUUM pgbench_branches, pgbench_tellers, pgbench_accounts",
             "-c", "TRUNCATE pgbench_history", "-c", "CHECKPOINT"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if out.returncode:
            die("resetting pgbench's tables failed:\n" + out.stdout)

    def alive(self):
        """The postmaster is up (its pid file names a live process) and accepts."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                os.kill(int(f.readline()), 0)
        except (OSError, ValueError):
            return False
        return port_open(self.port)

    def cpu(self):
        """CPU seconds of the postmaster and every process it started (backends that
        ended included), or None if that cannot be read."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return tree_cpu_seconds(int(f.readline()))
        except (OSError, ValueError, IndexError):
            return None

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

    def __init__(self, name, binary, work, runner, pg, userlist, instance=0, tls=False):
        self.name = name
        self.binary = binary
        self.work = work
        # With `tls`, it offers TLS to clients (client_tls_sslmode=prefer): the TLS
        # scenario's own pooler. The others offer none, so that libpq's default
        # `prefer` sends an SSLRequest and is answered N, as against most poolers.
        self.tls = tls
        dirname = "%s.%d" % (name, instance) if instance else name
        self.dir = os.path.join(work, dirname + ("-tls" if tls else ""))
        self.runner = runner
        self.pg = pg
        self.userlist = userlist
        self.port = None
        self.proc = None
        self.pid = None
        self.so_reuseport = False
        self.pool_size = None  # None: OPT.pool_size (bench/scale.py splits it over processes)
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
default_pool_size = {self.pool_size or OPT.pool_size}
max_client_conn = {max_client_conn}
; Same for both: a backlog deep enough for thousands of connects at once, and
; no log line per connection (PgBouncer's default logs two per -C transaction).
listen_backlog = 4096
log_connections = 0
log_disconnections = 0
""")
            if self.tls and self.pg.tls:
                # TLS for the clients that ask (the TLS scenario), with PostgreSQL's key.
                f.write("client_tls_sslmode = prefer\nclient_tls_key_file = %s\n"
                        "client_tls_cert_file = %s\n" % (self.pg.tls.key, self.pg.tls.cert))
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
            if self.name == "sluice" and OPT.workers is not None:
                env["SLUICE_WORKERS"] = str(OPT.workers)
            if self.name == "sluice" and OPT.profile_dir:
                # An instrumented build (--train) writes its profile here at exit.
                env["LLVM_PROFILE_FILE"] = os.path.join(OPT.profile_dir, "sluice-%p.profraw")
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

    def start(self, max_client_conn=MAX_CLIENT_CONN):
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
