//! SHOW HELP, VERSION and CONFIG; SET; and the parameters drivers like to SHOW or SET
//! on any connection (client_encoding ...), answered with fixed values as PgBouncer
//! does so that such drivers can use the console.

use bytes::BytesMut;

use super::rows::{self, Table, Ty};
use super::{CmdError, Ctx};
use crate::app::App;

/// Parameters drivers ask about, with the values PgBouncer's console reports.
const FAKE_PARAMS: &[(&str, &str)] = &[
    ("client_encoding", "UTF-8"),
    ("default_transaction_isolation", "read committed"),
    ("standard_conforming_strings", "on"),
    ("datestyle", "ISO"),
    ("timezone", "GMT"),
];

/// PgBouncer's no-reload settings: SHOW CONFIG marks them not changeable and SET
/// refuses them. A reload keeps the running values of those bound to the process
/// (`lifecycle::keep_restart_only`); `track_extra_parameters` alone applies to the
/// clients that log in after a reload (configuration.md, "Differences from
/// PgBouncer").
const RESTART_ONLY: &[&str] = &[
    "conffile",
    "disable_pqexec",
    "job_name",
    "listen_addr",
    "listen_backlog",
    "listen_port",
    "metrics_listen",
    // Cancel keys already issued carry it.
    "peer_id",
    "pidfile",
    "pkt_buf",
    "resolv_conf",
    "service_name",
    "so_reuseport",
    "track_extra_parameters",
    "unix_socket_dir",
    "unix_socket_group",
    "unix_socket_mode",
    "user",
];

fn fake(name: &str) -> Option<(&'static str, &'static str)> {
    FAKE_PARAMS
        .iter()
        .copied()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// `SHOW client_encoding` and friends; returns whether `name` was one of them.
pub fn fake_show(ctx: &mut Ctx<'_>, name: &str) -> bool {
    let Some((name, value)) = fake(name) else {
        return false;
    };
    let mut t = Table::new(&mut ctx.out, &[(name, Ty::Text)]);
    t.row(vec![value.into()]);
    t.finish();
    true
}

/// `SET key = value`: fake parameters are ignored with a notice; real settings need an
/// admin and change the running config (a new snapshot, as a reload would).
pub fn set(ctx: &mut Ctx<'_>, key: &str, value: &str) -> Result<(), CmdError> {
    if fake(key).is_some() {
        rows::message(&mut ctx.out, b'N', "NOTICE", "00000", "SET ignored", None);
        rows::command_complete(&mut ctx.out, "SET");
        return Ok(());
    }
    ctx.need_admin()?;
    let failed = |why: String| CmdError {
        detail: Some(why),
        ..CmdError::from("SET failed")
    };
    if RESTART_ONLY.contains(&key) {
        return Err(failed(format!("{key} can only be changed by a restart")));
    }
    let new = ctx.app.config().with_setting(key, value).map_err(|e| {
        failed(match e {
            crate::config::ConfigError::Line { message, .. } => message,
            other => other.to_string(),
        })
    })?;
    tracing::info!("SET {key} = {value}");
    ctx.app.set_config(new);
    rows::command_complete(&mut ctx.out, &format!("SET {key}={value}"));
    Ok(())
}

/// SHOW HELP: a notice listing the commands.
pub fn help(out: &mut BytesMut) {
    const USAGE: &str = "\n\
        \tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION\n\
        \tSHOW PEERS|PEER_POOLS\n\
        \tSHOW SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE\n\
        \tSHOW DNS_HOSTS|DNS_ZONES\n\
        \tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS\n\
        \tSET key = arg\n\
        \tRELOAD\n\
        \tPAUSE [<db>]\n\
        \tRESUME [<db>]\n\
        \tDISABLE <db>\n\
        \tENABLE <db>\n\
        \tRECONNECT [<db>]\n\
        \tKILL [<db>]\n\
        \tKILL_CLIENT <client_id>\n\
        \tSUSPEND\n\
        \tSHUTDOWN\n\
        \tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS\n\
        \tWAIT_CLOSE [<db>]";
    rows::message(out, b'N', "NOTICE", "00000", "Console usage", Some(USAGE));
    rows::command_complete(out, "SHOW");
}

/// SHOW VERSION.
pub fn version(out: &mut BytesMut) {
    let mut t = Table::new(out, &[("version", Ty::Text)]);
    t.row(vec![super::version_string().into()]);
    t.finish();
}

/// SHOW CONFIG: every setting with its value, PgBouncer's default, and whether it
/// can change without a restart.
pub fn config(app: &App, out: &mut BytesMut) {
    let cfg = app.config();
    let mut t = Table::new(
        out,
        &[
            ("key", Ty::Text),
            ("value", Ty::Text),
            ("default", Ty::Text),
            ("changeable", Ty::Text),
        ],
    );
    for (k, v) in &cfg.settings.raw {
        let default = crate::config::setting_default(k).unwrap_or("");
        let changeable = if RESTART_ONLY.contains(&k.as_str()) {
            "no"
        } else {
            "yes"
        };
        t.row(vec![k.into(), v.into(), default.into(), changeable.into()]);
    }
    t.finish();
}
