//! Log output in PgBouncer's shape: `2026-01-02 03:04:05.678 UTC [pid] LOG message`, to
//! stderr (unless `-q`/`-d`), to `logfile`, which SIGHUP reopens, and with `syslog`
//! to the syslog daemon (`syslog.rs`).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use super::syslog::{Syslog, SyslogConfig};

/// Where log lines go. Shared by the subscriber and the reload path.
#[derive(Debug)]
pub struct LogSink {
    stderr: bool,
    file: Mutex<Option<(PathBuf, File)>>,
    syslog: Mutex<Option<Syslog>>,
}

impl LogSink {
    /// Opens `logfile` (if any) for appending; `syslog` sends lines to the daemon too.
    pub fn new(
        stderr: bool,
        logfile: Option<PathBuf>,
        syslog: Option<SyslogConfig>,
    ) -> io::Result<Arc<LogSink>> {
        let file = match logfile {
            Some(p) => Some((p.clone(), open(&p)?)),
            None => None,
        };
        Ok(Arc::new(LogSink {
            stderr,
            file: Mutex::new(file),
            syslog: Mutex::new(syslog.map(Syslog::new)),
        }))
    }

    /// Reopens the log file (after rotation), possibly at a new path, and takes the
    /// syslog settings as they are now.
    pub fn reopen(&self, logfile: Option<PathBuf>, syslog: Option<SyslogConfig>) -> io::Result<()> {
        {
            let mut g = self.syslog.lock().unwrap_or_else(|p| p.into_inner());
            if g.as_ref().map(Syslog::config) != syslog.as_ref() {
                *g = syslog.map(Syslog::new);
            }
        }
        let mut g = self.file.lock().unwrap_or_else(|p| p.into_inner());
        *g = match logfile {
            Some(p) => Some((p.clone(), open(&p)?)),
            None => None,
        };
        Ok(())
    }

    fn write_line(&self, level: Level, line: &[u8]) {
        if self.stderr {
            let _ = io::stderr().write_all(line);
        }
        {
            let mut g = self.file.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, f)) = g.as_mut() {
                let _ = f.write_all(line);
            }
        }
        let mut g = self.syslog.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.as_mut() {
            // The daemon stamps the time and knows the pid: from the level on.
            let text = String::from_utf8_lossy(line);
            let text = text.split_once("] ").map_or(&*text, |(_, rest)| rest);
            s.send(level, text);
        }
    }
}

fn open(p: &PathBuf) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open logfile {}: {e}", p.display()),
            )
        })
}

/// A writer for one formatted event: collects it and writes it whole on drop.
pub struct LineWriter {
    sink: Arc<LogSink>,
    level: Level,
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        self.sink.write_line(self.level, &self.buf);
    }
}

/// Makes a [`LineWriter`] per event.
#[derive(Clone)]
pub struct SinkWriter(pub Arc<LogSink>);

impl<'a> MakeWriter<'a> for SinkWriter {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            sink: self.0.clone(),
            level: Level::INFO,
            buf: Vec::with_capacity(160),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        LineWriter {
            sink: self.0.clone(),
            level: *meta.level(),
            buf: Vec::with_capacity(160),
        }
    }
}

/// PgBouncer's line format.
pub struct PgFormat {
    pid: u32,
}

impl<S, N> FormatEvent<S, N> for PgFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "ERROR",
            Level::WARN => "WARNING",
            Level::INFO => "LOG",
            Level::DEBUG => "DEBUG",
            Level::TRACE => "NOISE",
        };
        // The stamp's ASCII bytes as they are: no String per line.
        let stamp = stamp(SystemTime::now());
        let stamp = std::str::from_utf8(&stamp).unwrap_or("");
        write!(w, "{stamp} [{}] {level} ", self.pid)?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Installs the global subscriber. `verbose` 0 logs LOG and above, 1 DEBUG, 2+ NOISE.
pub fn init(sink: Arc<LogSink>, verbose: u8) {
    let level = match verbose {
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .event_format(PgFormat {
            pid: std::process::id(),
        })
        .with_writer(SinkWriter(sink))
        .try_init();
}

/// `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub fn timestamp(t: SystemTime) -> String {
    stamp(t).iter().map(|&c| char::from(c)).collect()
}

/// `YYYY-MM-DD HH:MM:SS.mmm UTC` as ASCII bytes, written digit by digit: every log
/// line and two cells of each SHOW CLIENTS and SERVERS row pay for it, and `format!`
/// with seven padded fields took ~4,000 instructions (callgrind), ~20 times this.
pub fn stamp(t: SystemTime) -> [u8; 27] {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, day) = civil_from_days(days);
    let mut b = *b"0000-00-00 00:00:00.000 UTC";
    // Four digits of the year: from 1970 on, and to 9999.
    put_digits(&mut b[0..4], y.clamp(0, 9999) as u64);
    put_digits(&mut b[5..7], u64::from(m));
    put_digits(&mut b[8..10], u64::from(day));
    put_digits(&mut b[11..13], rem / 3600);
    put_digits(&mut b[14..16], rem % 3600 / 60);
    put_digits(&mut b[17..19], rem % 60);
    put_digits(&mut b[20..23], u64::from(d.subsec_millis()));
    b
}

/// `v`'s last `to.len()` decimal digits, zero-padded.
fn put_digits(to: &mut [u8], mut v: u64) {
    for c in to.iter_mut().rev() {
        *c = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_known_instants() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01 00:00:00.000 UTC");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789); // 2024-02-29 12:34:56.789
        assert_eq!(timestamp(t), "2024-02-29 12:34:56.789 UTC");
        let t = UNIX_EPOCH + Duration::from_millis(4_102_444_799_007); // 2099-12-31 23:59:59.007
        assert_eq!(timestamp(t), "2099-12-31 23:59:59.007 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29 (a 400-year leap day)
        assert_eq!(timestamp(t), "2000-02-29 00:00:00.000 UTC");
    }
}
