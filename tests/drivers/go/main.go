// pgx v5 through a transaction pooler, in its default QueryExecModeCacheStatement
// (every query with arguments becomes a named statement "stmtcache_<hash>"),
// sequentially and in batches (Parses, then Binds, pipelined before one Sync).
// Prints one JSON line; exits 1 on a wrong result or an unexpected error. The
// scenario is described in tests/it/drivers.rs.
//
// Connection parameters: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE; workload:
// DRIVER_WORKERS, DRIVER_ITERS, DRIVER_TIMEOUT_S.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	qDouble = "SELECT $1::int * 2, $2::text"
	qInsert = "INSERT INTO items (worker, seq, val) VALUES ($1, $2, $3)"
	qVal    = "SELECT val FROM items WHERE worker = $1 AND seq = $2"
	qCount  = "SELECT count(*) FROM items WHERE worker = $1"
	qAppend = "UPDATE items SET val = val || $3 WHERE worker = $1 AND seq = $2"
	qDiv    = "SELECT 100 / $1::int"
	qStar   = "SELECT * FROM ddl_t WHERE id = $1"
	qA      = "SELECT a FROM ddl_t WHERE id = $1"
	ddl     = "ALTER TABLE ddl_t ADD COLUMN b text NOT NULL DEFAULT 'x'"

	ddlConns    = 4
	ddlAttempts = 5
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

var (
	workers = envInt("DRIVER_WORKERS", 12)
	iters   = envInt("DRIVER_ITERS", 40)
)

func connect(ctx context.Context) (*pgx.Conn, error) {
	dsn := fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s sslmode=disable connect_timeout=10",
		os.Getenv("PGHOST"), os.Getenv("PGPORT"), os.Getenv("PGUSER"), os.Getenv("PGPASSWORD"), os.Getenv("PGDATABASE"))
	return pgx.Connect(ctx, dsn)
}

func key(w, i int) int { return w*100000 + i }

// sqlState is the SQLSTATE of a server error, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// firstErr is the first non-nil error (errors.Join needs Go 1.20; this module
// builds with Debian 12's Go 1.19).
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func check[T comparable](what string, got, want T) error {
	if got != want {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

func one[T any](ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (T, error) {
	var v T
	err := q.QueryRow(ctx, sql, args...).Scan(&v)
	return v, err
}

func double(ctx context.Context, c *pgx.Conn, k int, s string) error {
	var n int
	var t string
	if err := c.QueryRow(ctx, qDouble, k, s).Scan(&n, &t); err != nil {
		return fmt.Errorf("double: %w", err)
	}
	if n != 2*k || t != s {
		return fmt.Errorf("double: got (%d, %q), want (%d, %q)", n, t, 2*k, s)
	}
	return nil
}

func txn(ctx context.Context, c *pgx.Conn, w, i int) error {
	v := fmt.Sprintf("v%d-%d", w, i)
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qInsert, w, i, v); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if w%2 == 1 {
			// Batched: pgx prepares what it lacks, then pipelines the Binds.
			b := &pgx.Batch{}
			b.Queue(qVal, w, i)
			b.Queue(qCount, w)
			for _, s := range []string{"a", "b", "c"} {
				b.Queue(qAppend, w, i, s)
			}
			b.Queue(qVal, w, i)
			br := tx.SendBatch(ctx, b)
			var got1, got2 string
			var n int64
			err := br.QueryRow().Scan(&got1)
			if err == nil {
				err = br.QueryRow().Scan(&n)
			}
			for j := 0; j < 3 && err == nil; j++ {
				var tag pgconn.CommandTag
				tag, err = br.Exec()
				if err == nil && tag.RowsAffected() != 1 {
					err = fmt.Errorf("append: %d rows", tag.RowsAffected())
				}
			}
			if err == nil {
				err = br.QueryRow().Scan(&got2)
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("batch: %w", err)
			}
			return firstErr(check("batch val", got1, v), check("batch count", n, int64(i+1)),
				check("batch appended", got2, v+"abc"))
		}
		got, err := one[string](ctx, tx, qVal, w, i)
		if err != nil {
			return fmt.Errorf("val: %w", err)
		}
		n, err := one[int64](ctx, tx, qCount, w)
		if err != nil {
			return fmt.Errorf("count: %w", err)
		}
		tag, err := tx.Exec(ctx, qAppend, w, i, "!")
		if err != nil {
			return fmt.Errorf("append: %w", err)
		}
		return firstErr(check("val", got, v), check("count", n, int64(i+1)),
			check("append", tag.RowsAffected(), int64(1)))
	})
}

func divisionByZero(ctx context.Context, c *pgx.Conn, w, i int) error {
	if _, err := one[int](ctx, c, qDiv, 0); sqlState(err) != "22012" {
		return fmt.Errorf("100 / 0: want division_by_zero, got %v", err)
	}
	if got, err := one[int](ctx, c, qDiv, 4); err != nil || got != 25 {
		return fmt.Errorf("after error: got %d, %v", got, err)
	}
	if i%14 != 3 {
		return nil
	}
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		var n int
		var t string
		if err := tx.QueryRow(ctx, qDouble, key(w, i), "t").Scan(&n, &t); err != nil {
			return fmt.Errorf("in txn: %w", err)
		}
		_, err := one[int](ctx, tx, qDiv, 0)
		return err
	})
	if sqlState(err) != "22012" {
		return fmt.Errorf("100 / 0 in a transaction: want division_by_zero, got %v", err)
	}
	n, err := one[int64](ctx, c, qCount, w)
	if err != nil {
		return err
	}
	return check("count after rollback", n, int64(i+1))
}

// reset runs DEALLOCATE ALL (pgx's DeallocateAll, which also clears its caches)
// or DISCARD ALL (plain Exec: pgx does not notice, so, as with PostgreSQL itself,
// its next cached statement fails with 26000; DeallocateAll then makes it forget
// the others).
func reset(ctx context.Context, c *pgx.Conn, w, i int) error {
	if _, err := c.Prepare(ctx, "chk", "SELECT 1"); err != nil {
		return fmt.Errorf("prepare chk: %w", err)
	}
	discard := (i/10)%2 == 1
	if discard {
		if _, err := c.Exec(ctx, "DISCARD ALL"); err != nil {
			return fmt.Errorf("discard all: %w", err)
		}
	} else if err := c.DeallocateAll(ctx); err != nil {
		return fmt.Errorf("deallocate all: %w", err)
	}
	_, err := c.PgConn().ExecPrepared(ctx, "chk", nil, nil, nil).Close()
	if sqlState(err) != "26000" {
		return fmt.Errorf("chk after reset: want 26000, got %v", err)
	}
	if discard {
		err := double(ctx, c, key(w, i), "after discard")
		if sqlState(err) != "26000" {
			return fmt.Errorf("cached statement after DISCARD ALL: want 26000, got %v", err)
		}
		// Make pgx forget the rest of its statements too.
		if err := c.DeallocateAll(ctx); err != nil {
			return fmt.Errorf("deallocate all: %w", err)
		}
	}
	return double(ctx, c, key(w, i), "after reset")
}

func worker(ctx context.Context, w int, done *int) error {
	c, err := connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for i := 0; i < iters; i++ {
		if err := double(ctx, c, key(w, i), fmt.Sprintf("w%d-i%d", w, i)); err != nil {
			return fmt.Errorf("iteration %d: %w", i, err)
		}
		if err := txn(ctx, c, w, i); err != nil {
			return fmt.Errorf("iteration %d txn: %w", i, err)
		}
		if i%7 == 3 {
			if err := divisionByZero(ctx, c, w, i); err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
		}
		if i%10 == 9 {
			if err := reset(ctx, c, w, i); err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
		}
		*done++
	}
	return nil
}

type ddlOutcome struct {
	CachedPlanErrors int `json:"cached_plan_errors"`
	Recovered        int `json:"recovered"`
	Of               int `json:"of"`
}

func parallel(n int, f func(j int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for j := 0; j < n; j++ {
		wg.Add(1)
		go func(j int) { defer wg.Done(); errs[j] = f(j) }(j)
	}
	wg.Wait()
	return firstErr(errs...)
}

func ddlPhase(ctx context.Context) (ddlOutcome, error) {
	out := ddlOutcome{Of: ddlConns}
	conns := make([]*pgx.Conn, ddlConns)
	for j := range conns {
		c, err := connect(ctx)
		if err != nil {
			return out, err
		}
		defer c.Close(context.Background())
		conns[j] = c
	}
	err := parallel(ddlConns, func(j int) error {
		for n := 0; n < 10; n++ {
			id := 1 + (j*10+n)%100
			var gid, a int
			if err := conns[j].QueryRow(ctx, qStar, id).Scan(&gid, &a); err != nil || a != id*10 {
				return fmt.Errorf("star: %d %d %v", gid, a, err)
			}
			if a, err := one[int](ctx, conns[j], qA, id); err != nil || a != id*10 {
				return fmt.Errorf("a: %d %v", a, err)
			}
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	if _, err := conns[0].Exec(ctx, ddl); err != nil {
		return out, err
	}
	var mu sync.Mutex
	err = parallel(ddlConns, func(j int) error {
		id := 50 + j
		if a, err := one[int](ctx, conns[j], qA, id); err != nil || a != id*10 {
			return fmt.Errorf("a after ddl: %d %v", a, err)
		}
		for n := 0; n < ddlAttempts; n++ {
			var gid, a int
			var b string
			err := conns[j].QueryRow(ctx, qStar, id).Scan(&gid, &a, &b)
			if sqlState(err) == "0A000" {
				mu.Lock()
				out.CachedPlanErrors++
				mu.Unlock()
				continue
			}
			if err != nil || gid != id || a != id*10 || b != "x" {
				return fmt.Errorf("star after ddl: (%d, %d, %q) %v", gid, a, b, err)
			}
			mu.Lock()
			out.Recovered++
			mu.Unlock()
			break
		}
		return nil
	})
	return out, err
}

func main() {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(),
		time.Duration(envInt("DRIVER_TIMEOUT_S", 120))*time.Second)
	defer cancel()
	done := make([]int, workers)
	err := parallel(workers, func(w int) error {
		if err := worker(ctx, w, &done[w]); err != nil {
			return fmt.Errorf("worker %d: %w", w, err)
		}
		return nil
	})
	var outcome *ddlOutcome
	if err == nil {
		var o ddlOutcome
		o, err = ddlPhase(ctx)
		if err != nil {
			err = fmt.Errorf("ddl: %w", err)
		}
		outcome = &o
	}
	total := 0
	for _, d := range done {
		total += d
	}
	report := map[string]any{
		"driver": "pgx", "ok": err == nil, "workers": workers, "iterations": total,
		"ddl": outcome, "seconds": time.Since(start).Seconds(),
	}
	if err != nil {
		report["errors"] = []string{err.Error()}
	}
	line, _ := json.Marshal(report)
	fmt.Println(string(line))
	if err != nil {
		os.Exit(1)
	}
}
