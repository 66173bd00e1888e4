"""Shared bits of the Python driver programs (see tests/it/drivers.rs for the
scenario they all follow).

Connection parameters come from PGHOST, PGPORT, PGUSER, PGPASSWORD and
PGDATABASE; the workload size from DRIVER_WORKERS, DRIVER_ITERS and
DRIVER_TIMEOUT_S.
"""

import json
import os
import sys
import time

WORKERS = int(os.environ.get("DRIVER_WORKERS", "12"))
ITERS = int(os.environ.get("DRIVER_ITERS", "40"))
TIMEOUT_S = float(os.environ.get("DRIVER_TIMEOUT_S", "120"))
DDL_CONNS = 4
DDL_ATTEMPTS = 5
START = time.monotonic()

# The statements of the scenario (psycopg-style placeholders; asyncpg converts).
Q_DOUBLE = "SELECT %s::int * 2, %s::text"
Q_INSERT = "INSERT INTO items (worker, seq, val) VALUES (%s, %s, %s)"
Q_VAL = "SELECT val FROM items WHERE worker = %s AND seq = %s"
Q_COUNT = "SELECT count(*) FROM items WHERE worker = %s"
Q_BANG = "UPDATE items SET val = val || '!' WHERE worker = %s AND seq = %s"
Q_DIV = "SELECT 100 / %s::int"
Q_STAR = "SELECT * FROM ddl_t WHERE id = %s"
Q_A = "SELECT a FROM ddl_t WHERE id = %s"
DDL = "ALTER TABLE ddl_t ADD COLUMN b text NOT NULL DEFAULT 'x'"

CACHED_PLAN = "cached plan must not change result type"


class Fail(Exception):
    """A wrong result or an unexpected error."""


def params():
    return {
        "host": os.environ["PGHOST"],
        "port": int(os.environ["PGPORT"]),
        "user": os.environ["PGUSER"],
        "password": os.environ.get("PGPASSWORD", ""),
        "dbname": os.environ["PGDATABASE"],
    }


def check(what, got, want):
    if got != want:
        raise Fail(f"{what}: got {got!r}, want {want!r}")


def check_deadline():
    if time.monotonic() - START > TIMEOUT_S:
        raise Fail(f"over the {TIMEOUT_S:.0f} s time limit")


def key(w, i):
    return w * 100000 + i


def dollar(q):
    """psycopg placeholders to $n."""
    n = 0
    out = []
    parts = q.split("%s")
    for p in parts[:-1]:
        n += 1
        out.append(p + f"${n}")
    out.append(parts[-1])
    return "".join(out)


def report(driver, ok, **fields):
    fields = {"driver": driver, "ok": ok, **fields}
    fields["seconds"] = round(time.monotonic() - START, 2)
    print(json.dumps(fields, sort_keys=False), flush=True)
    sys.exit(0 if ok else 1)
