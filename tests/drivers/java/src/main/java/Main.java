// pgjdbc through a transaction pooler: server-side prepared statements (S_n) after
// prepareThreshold executions, 1 on even workers and the default (5) on odd ones,
// plus JDBC batches (Binds pipelined before one Sync). Prints one JSON line; exits 1
// on a wrong result or an unexpected error. The scenario is described in
// tests/it/drivers.rs.
//
// Connection parameters: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE; workload:
// DRIVER_WORKERS, DRIVER_ITERS, DRIVER_TIMEOUT_S.

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

public class Main {
    static final String Q_DOUBLE = "SELECT ?::int * 2, ?::text";
    static final String Q_INSERT = "INSERT INTO items (worker, seq, val) VALUES (?, ?, ?)";
    static final String Q_VAL = "SELECT val FROM items WHERE worker = ? AND seq = ?";
    static final String Q_COUNT = "SELECT count(*) FROM items WHERE worker = ?";
    static final String Q_APPEND = "UPDATE items SET val = val || ? WHERE worker = ? AND seq = ?";
    static final String Q_DIV = "SELECT 100 / ?::int";
    static final String Q_STAR = "SELECT * FROM ddl_t WHERE id = ?";
    static final String Q_A = "SELECT a FROM ddl_t WHERE id = ?";
    static final String DDL = "ALTER TABLE ddl_t ADD COLUMN b text NOT NULL DEFAULT 'x'";
    static final int DDL_CONNS = 4;
    static final int DDL_ATTEMPTS = 5;

    static final int WORKERS = envInt("DRIVER_WORKERS", 12);
    static final int ITERS = envInt("DRIVER_ITERS", 40);
    static final int TIMEOUT_S = envInt("DRIVER_TIMEOUT_S", 120);
    static final long START = System.nanoTime();
    /** DRIVER_SKIP_RESET=1 leaves out the DEALLOCATE ALL / DISCARD ALL step. */
    static final boolean RESET = envInt("DRIVER_SKIP_RESET", 0) == 0;

    static int envInt(String name, int def) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? def : Integer.parseInt(v);
    }

    static class Fail extends Exception {
        Fail(String msg) {
            super(msg);
        }
    }

    static void check(String what, Object got, Object want) throws Fail {
        if (!String.valueOf(got).equals(String.valueOf(want))) {
            throw new Fail(what + ": got " + got + ", want " + want);
        }
    }

    static Connection connect(Integer prepareThreshold) throws SQLException {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT")
                + "/" + System.getenv("PGDATABASE");
        Properties p = new Properties();
        p.setProperty("user", System.getenv("PGUSER"));
        p.setProperty("password", System.getenv("PGPASSWORD"));
        p.setProperty("sslmode", "disable");
        p.setProperty("connectTimeout", "10");
        p.setProperty("socketTimeout", String.valueOf(TIMEOUT_S));
        if (prepareThreshold != null) {
            p.setProperty("prepareThreshold", prepareThreshold.toString());
        }
        return DriverManager.getConnection(url, p);
    }

    /** Runs a prepared query with int/string parameters and returns its single row. */
    static List<Object> row(Connection c, String sql, Object... args) throws SQLException, Fail {
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            for (int j = 0; j < args.length; j++) {
                ps.setObject(j + 1, args[j]);
            }
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    throw new Fail(sql + ": no row");
                }
                List<Object> out = new ArrayList<>();
                for (int j = 1; j <= rs.getMetaData().getColumnCount(); j++) {
                    out.add(rs.getObject(j));
                }
                if (rs.next()) {
                    throw new Fail(sql + ": more than one row");
                }
                return out;
            }
        }
    }

    static void expectState(String what, String state, Callable body) throws Exception {
        try {
            body.run();
        } catch (SQLException e) {
            if (state.equals(e.getSQLState())) {
                return;
            }
            throw new Fail(what + ": want SQLSTATE " + state + ", got " + e.getSQLState() + " " + e.getMessage());
        }
        throw new Fail(what + ": no error");
    }

    interface Callable {
        void run() throws Exception;
    }

    static void txn(Connection c, int w, int i) throws Exception {
        String v = "v" + w + "-" + i;
        c.setAutoCommit(false);
        try (PreparedStatement ins = c.prepareStatement(Q_INSERT)) {
            ins.setInt(1, w);
            ins.setInt(2, i);
            ins.setString(3, v);
            check("insert", ins.executeUpdate(), 1);
        }
        check("val", row(c, Q_VAL, w, i), List.of(v));
        check("count", row(c, Q_COUNT, w), List.of((long) i + 1));
        try (PreparedStatement app = c.prepareStatement(Q_APPEND)) {
            for (String s : new String[] {"a", "b", "c"}) {
                app.setString(1, s);
                app.setInt(2, w);
                app.setInt(3, i);
                app.addBatch();
            }
            int[] counts = app.executeBatch();
            check("batch", java.util.Arrays.toString(counts), "[1, 1, 1]");
        }
        check("appended", row(c, Q_VAL, w, i), List.of(v + "abc"));
        c.commit();
        c.setAutoCommit(true);
    }

    static void divisionByZero(Connection c, int w, int i) throws Exception {
        expectState("100 / 0", "22012", () -> row(c, Q_DIV, 0));
        check("after error", row(c, Q_DIV, 4), List.of(25));
        if (i % 14 != 3) {
            return;
        }
        c.setAutoCommit(false);
        int k = w * 100000 + i;
        check("in txn", row(c, Q_DOUBLE, k, "t"), List.of(2 * k, "t"));
        expectState("100 / 0 in a transaction", "22012", () -> row(c, Q_DIV, 0));
        c.rollback();
        c.setAutoCommit(true);
        check("count after rollback", row(c, Q_COUNT, w), List.of((long) i + 1));
    }

    /**
     * DEALLOCATE ALL or DISCARD ALL from the client (pgjdbc sends it with the extended
     * protocol, notices the command tag and re-prepares what it had prepared).
     */
    static void reset(Connection c, int w, int i) throws Exception {
        String command = (i / 10) % 2 == 0 ? "DEALLOCATE ALL" : "DISCARD ALL";
        try (PreparedStatement ps = c.prepareStatement(Q_DOUBLE)) {
            for (int n = 0; n < 7; n++) {
                ps.setInt(1, n);
                ps.setString(2, "r");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    check("before reset", rs.getInt(1), 2 * n);
                }
                if (n == 5) {
                    try (Statement s = c.createStatement()) {
                        s.execute(command);
                    }
                }
            }
        }
    }

    static void worker(int w, AtomicInteger done) throws Exception {
        try (Connection c = connect(w % 2 == 0 ? 1 : null)) {
            for (int i = 0; i < ITERS; i++) {
                if (System.nanoTime() - START > TimeUnit.SECONDS.toNanos(TIMEOUT_S)) {
                    throw new Fail("over the time limit");
                }
                int k = w * 100000 + i;
                check("double", row(c, Q_DOUBLE, k, "w" + w + "-i" + i), List.of(2 * k, "w" + w + "-i" + i));
                txn(c, w, i);
                if (i % 7 == 3) {
                    divisionByZero(c, w, i);
                }
                if (i % 10 == 9 && RESET) {
                    reset(c, w, i);
                }
                done.incrementAndGet();
            }
        }
    }

    static String ddlPhase(ExecutorService pool) throws Exception {
        List<Connection> conns = new ArrayList<>();
        AtomicInteger errors = new AtomicInteger();
        AtomicInteger recovered = new AtomicInteger();
        try {
            for (int j = 0; j < DDL_CONNS; j++) {
                conns.add(connect(1));
            }
            List<Future<?>> fs = new ArrayList<>();
            for (int j = 0; j < DDL_CONNS; j++) {
                final int jj = j;
                fs.add(pool.submit(() -> {
                    for (int n = 0; n < 10; n++) {
                        int id = 1 + (jj * 10 + n) % 100;
                        check("star", row(conns.get(jj), Q_STAR, id), List.of(id, id * 10));
                        check("a", row(conns.get(jj), Q_A, id), List.of(id * 10));
                    }
                    return null;
                }));
            }
            for (Future<?> f : fs) {
                f.get();
            }
            try (Statement s = conns.get(0).createStatement()) {
                s.execute(DDL);
            }
            fs.clear();
            for (int j = 0; j < DDL_CONNS; j++) {
                final int jj = j;
                fs.add(pool.submit(() -> {
                    int id = 50 + jj;
                    check("a after ddl", row(conns.get(jj), Q_A, id), List.of(id * 10));
                    for (int n = 0; n < DDL_ATTEMPTS; n++) {
                        List<Object> got;
                        try {
                            got = row(conns.get(jj), Q_STAR, id);
                        } catch (SQLException e) {
                            if (!"0A000".equals(e.getSQLState())) {
                                throw e;
                            }
                            errors.incrementAndGet();
                            continue;
                        }
                        check("star after ddl", got, List.of(id, id * 10, "x"));
                        recovered.incrementAndGet();
                        break;
                    }
                    return null;
                }));
            }
            for (Future<?> f : fs) {
                f.get();
            }
        } finally {
            for (Connection c : conns) {
                c.close();
            }
        }
        return "{\"cached_plan_errors\":" + errors + ",\"recovered\":" + recovered + ",\"of\":" + DDL_CONNS + "}";
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    public static void main(String[] args) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(WORKERS + DDL_CONNS);
        AtomicInteger done = new AtomicInteger();
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        List<Future<?>> fs = new ArrayList<>();
        for (int w = 0; w < WORKERS; w++) {
            final int ww = w;
            fs.add(pool.submit(() -> {
                try {
                    worker(ww, done);
                } catch (Exception e) {
                    errors.add("worker " + ww + ": " + e);
                }
            }));
        }
        for (Future<?> f : fs) {
            f.get(TIMEOUT_S + 10, TimeUnit.SECONDS);
        }
        String ddl = "null";
        if (errors.isEmpty()) {
            try {
                ddl = ddlPhase(pool);
            } catch (Exception e) {
                errors.add("ddl: " + e);
            }
        }
        pool.shutdownNow();
        boolean ok = errors.isEmpty();
        List<String> quoted = new ArrayList<>();
        for (String e : errors.subList(0, Math.min(5, errors.size()))) {
            quoted.add(quote(e));
        }
        System.out.println("{\"driver\":\"pgjdbc\",\"ok\":" + ok
                + ",\"version\":" + quote(org.postgresql.Driver.class.getPackage().getImplementationVersion() + "")
                + ",\"workers\":" + WORKERS + ",\"iterations\":" + done + ",\"ddl\":" + ddl
                + ",\"errors\":[" + String.join(",", quoted) + "]"
                + ",\"seconds\":" + (System.nanoTime() - START) / 1e9 + "}");
        System.exit(ok ? 0 : 1);
    }
}
