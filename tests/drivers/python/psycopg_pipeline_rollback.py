#!/usr/bin/env python3
"""psycopg 3 in pipeline mode: after a ROLLBACK, psycopg drops its prepared
statements with its own DEALLOCATE ALL, sent (in pipeline mode) with the extended
protocol. Other clients' and this client's prepared statements must keep working.
Prints one JSON line; exits 1 on an error. See tests/it/drivers/external.rs."""

import psycopg

from _common import ITERS, Fail, check, check_deadline, params, report


def main():
    errs = []
    done = 0
    try:
        a = psycopg.connect(**params(), connect_timeout=10)  # implicit transactions
        b = psycopg.connect(**params(), autocommit=True, connect_timeout=10)
        for i in range(ITERS):
            check_deadline()
            check("b", b.execute("SELECT %s::int + 1", (i,), prepare=True).fetchone(), (i + 1,))
            with a.pipeline():
                a.execute("SELECT %s::int * 2", (i,), prepare=True)
                a.rollback()
                got = a.execute("SELECT %s::int * 2", (i,), prepare=True).fetchone()
                check("a", got, (2 * i,))
            a.commit()
            done += 1
        a.close()
        b.close()
    except (Fail, psycopg.Error) as e:
        errs.append(f"iteration {done}: {type(e).__name__}: {e}")
    report("psycopg-pipeline-rollback", not errs, iterations=done, errors=errs)


if __name__ == "__main__":
    main()
