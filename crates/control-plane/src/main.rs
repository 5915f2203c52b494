//! `edgeprof-control-plane`: flags and environment → a validated
//! [`Config`] → [`ControlPlane::start`]. Also `token create|list|revoke`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use edgeprof_control_plane::history::pyroscope::PyroscopeConfig;
use edgeprof_control_plane::names::AccountId;
use edgeprof_control_plane::server::TlsFiles;
use edgeprof_control_plane::{Config, ControlPlane, DevAccount, store::Store};

/// The edgeprof control plane: REST API, agent registry, capture fan-out.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// REST listen address.
    #[arg(
        long,
        env = "EDGEPROF_HTTP_LISTEN",
        default_value = "127.0.0.1:8080",
        global = true
    )]
    http_listen: SocketAddr,
    /// gRPC (agent Registry) listen address.
    #[arg(
        long,
        env = "EDGEPROF_GRPC_LISTEN",
        default_value = "127.0.0.1:9090",
        global = true
    )]
    grpc_listen: SocketAddr,
    /// SQLite file path (created if missing) or a postgres:// URL.
    #[arg(
        long,
        env = "EDGEPROF_DATABASE",
        default_value = "edgeprof-control-plane.sqlite",
        global = true
    )]
    database: String,
    /// Shared secret agents present (and are sent), ≥ 8 characters;
    /// required unless --dev.
    #[arg(
        long,
        env = "EDGEPROF_AGENT_SECRET",
        hide_env_values = true,
        global = true
    )]
    agent_secret: Option<String>,
    /// How often agents heartbeat, in milliseconds.
    #[arg(
        long,
        env = "EDGEPROF_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000,
        global = true
    )]
    heartbeat_interval_ms: u64,
    /// How long a machine keeps its Durable Objects after it was last heard
    /// from, in milliseconds: an object moves to another machine only after
    /// its owner has been silent this long (the owner stops serving it
    /// first). At least 3 heartbeat intervals; default 4.
    #[arg(long, env = "EDGEPROF_DURABLE_OBJECT_LEASE_MS", global = true)]
    durable_object_lease_ms: Option<u64>,
    /// Extra time an agent gets beyond a capture's duration, in milliseconds.
    #[arg(
        long,
        env = "EDGEPROF_CAPTURE_SLACK_MS",
        default_value_t = 2000,
        global = true
    )]
    capture_slack_ms: u64,
    /// Most captures of one script running at once (more get 429; so does a
    /// capture of isolates another capture is profiling).
    #[arg(
        long,
        env = "EDGEPROF_MAX_CAPTURES_PER_SCRIPT",
        default_value_t = 2,
        global = true
    )]
    max_captures_per_script: usize,
    /// Local use: create account `dev` with a token at start and print it;
    /// the agent secret defaults to `dev-agent-secret`.
    #[arg(long, env = "EDGEPROF_DEV", global = true)]
    dev: bool,
    /// With --dev: use this token instead of a random one.
    #[arg(
        long,
        env = "EDGEPROF_DEV_TOKEN",
        hide_env_values = true,
        global = true
    )]
    dev_token: Option<String>,
    /// Directory the browser dashboard is served from (default: the
    /// `target/dist` that `cargo xtask dist` writes).
    #[arg(long, env = "EDGEPROF_DASHBOARD_DIR", global = true)]
    dashboard_dir: Option<std::path::PathBuf>,
    /// Serve the REST API over TLS with this PEM certificate chain (with
    /// --tls-key).
    #[arg(long, env = "EDGEPROF_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "EDGEPROF_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Delete capture sessions and their profiles older than this, in the
    /// background: a number with a unit, `d`, `h` or `m` (e.g. `30d`), or
    /// `forever` to keep them.
    #[arg(long, env = "EDGEPROF_RETENTION", default_value = "30d")]
    retention: String,
    /// Delete continuous-profiling windows that ended longer ago than this,
    /// in the background (`d`, `h` or `m`, at least `1h`).
    #[arg(long, env = "EDGEPROF_HISTORY_RETENTION", default_value = "7d")]
    history_retention: String,
    /// Forward every stored continuous-profiling window to Grafana
    /// Pyroscope's push API at this base URL (`http://host:port`); off by
    /// default.
    #[arg(long, env = "EDGEPROF_PYROSCOPE_URL")]
    pyroscope_url: Option<String>,
    /// With --pyroscope-url: the tenant, sent as `X-Scope-OrgID`.
    #[arg(long, env = "EDGEPROF_PYROSCOPE_TENANT", requires = "pyroscope_url")]
    pyroscope_tenant: Option<String>,
    /// Delete a Durable Object's placement when no machine has placed,
    /// confirmed or listed it for this long (`h` or `m`, at least `10m` and
    /// twice the lease); its next request places it afresh.
    #[arg(long, env = "EDGEPROF_DURABLE_OBJECT_TTL", default_value = "1h")]
    durable_object_ttl: String,
    /// Most REST connections open at once; more are closed on arrival.
    #[arg(long, env = "EDGEPROF_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Time a REST client has to send its request headers (and how long an
    /// idle keep-alive connection stays open), in milliseconds.
    #[arg(long, env = "EDGEPROF_HEADER_TIMEOUT_MS", default_value_t = 10_000)]
    header_timeout_ms: u64,
    /// Validate the configuration (and reach the database), then exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Create a token for an account (creating the account); prints it once.
    Create {
        /// Account the token may act on.
        #[arg(long)]
        account: String,
    },
    /// List tokens (their public ids, never the secrets).
    List {
        /// Only this account's.
        #[arg(long)]
        account: Option<String>,
    },
    /// Revoke a token by its public id (as `token list` shows it).
    Revoke {
        /// The token's id.
        id: String,
        /// Only if it belongs to this account.
        #[arg(long)]
        account: Option<String>,
    },
}

/// `30d`, `12h`, `90m` or `forever`.
fn parse_retention(v: &str) -> Result<Option<Duration>> {
    if v == "forever" {
        return Ok(None);
    }
    parse_age("--retention", v, "`30d`, or `forever`").map(Some)
}

/// A whole number with a unit `d`, `h` or `m`, for flag `flag`.
fn parse_age(flag: &str, v: &str, example: &str) -> Result<Duration> {
    let bad = || {
        anyhow::anyhow!(
            "{flag}: `{v}` must be a whole number with a unit `d`, `h` or `m` (e.g. {example})"
        )
    };
    let (n, unit) = v.split_at(v.len().saturating_sub(1));
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "d" => n.checked_mul(86_400),
        "h" => n.checked_mul(3_600),
        "m" => n.checked_mul(60),
        _ => None,
    }
    .filter(|s| *s <= 100 * 365 * 86_400)
    .ok_or_else(bad)?;
    Ok(Duration::from_secs(secs))
}

fn config(args: &Args) -> Result<Config> {
    let secret = match (&args.agent_secret, args.dev) {
        (Some(s), _) => s.clone(),
        (None, true) => "dev-agent-secret".to_owned(),
        (None, false) => anyhow::bail!(
            "agent secret: required (--agent-secret or EDGEPROF_AGENT_SECRET), unless --dev"
        ),
    };
    if args.dev_token.is_some() && !args.dev {
        anyhow::bail!("--dev-token: only meaningful with --dev");
    }
    let mut c = Config::new(&args.database, secret);
    c.http_listen = args.http_listen;
    c.grpc_listen = args.grpc_listen;
    c.heartbeat_interval = Duration::from_millis(args.heartbeat_interval_ms);
    c.durable_object_lease = args.durable_object_lease_ms.map(Duration::from_millis);
    c.capture_slack = Duration::from_millis(args.capture_slack_ms);
    c.max_captures_per_script = args.max_captures_per_script;
    c.dev = args.dev.then(|| DevAccount {
        account: "dev".into(),
        token: args.dev_token.clone(),
    });
    if let Some(dir) = &args.dashboard_dir {
        c.dashboard_dir = dir.clone();
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        c.tls = Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    c.retention = parse_retention(&args.retention)?;
    c.history_retention = parse_age("--history-retention", &args.history_retention, "`7d`")?;
    if let Some(url) = &args.pyroscope_url {
        let p = PyroscopeConfig::new(url, args.pyroscope_tenant.as_deref())
            .map_err(|e| anyhow::anyhow!("--pyroscope-url: {e}"))?;
        c.pyroscope = Some(p);
    }
    c.durable_object_ttl = parse_age("--durable-object-ttl", &args.durable_object_ttl, "`1h`")?;
    c.http.max_connections = args.max_connections;
    c.http.header_timeout = Duration::from_millis(args.header_timeout_ms);
    c.validate()?;
    Ok(c)
}

async fn run(args: Args) -> Result<()> {
    if let Some(Command::Token { command }) = &args.command {
        return token(&args.database, command).await;
    }
    let config = config(&args)?;
    if args.check_config {
        Store::open(&config.database)
            .await
            .context("opening the database")?;
        eprintln!("edgeprof-control-plane: configuration OK");
        return Ok(());
    }
    let mut cp = ControlPlane::start(config).await?;
    let scheme = if cp.tls { "https" } else { "http" };
    eprintln!(
        "edgeprof-control-plane: REST on {scheme}://{}",
        cp.http_addr
    );
    eprintln!("edgeprof-control-plane: gRPC Registry on {}", cp.grpc_addr);
    if let Some(token) = &cp.dev_token {
        eprintln!("edgeprof-control-plane: dev account `dev`, token {token}");
    }
    tokio::select! {
        r = cp.wait() => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("edgeprof-control-plane: shutting down");
            Ok(())
        }
    }
}

async fn token(database: &str, command: &TokenCommand) -> Result<()> {
    let account = |a: &Option<String>| -> Result<Option<AccountId>> {
        Ok(a.as_deref()
            .map(|a| AccountId::parse("--account", a))
            .transpose()?)
    };
    let store = Store::open(database)
        .await
        .context("opening the database")?;
    match command {
        TokenCommand::Create { account } => {
            let account = AccountId::parse("--account", account)?;
            let token = store.create_token(&account).await?;
            eprintln!(
                "edgeprof-control-plane: created a token for account `{account}` (shown once):"
            );
            println!("{token}");
        }
        TokenCommand::List { account: a } => {
            let a = account(a)?;
            println!("{:<16}  {:<24}  CREATED (Unix ms)", "ID", "ACCOUNT");
            for t in store.tokens(a.as_deref()).await? {
                println!("{:<16}  {:<24}  {}", t.id, t.account_id, t.created_at_ms);
            }
        }
        TokenCommand::Revoke { id, account: a } => {
            let a = account(a)?;
            if !store.revoke_token(a.as_deref(), id).await? {
                anyhow::bail!("no token with id `{id}`; `token list` shows the ids");
            }
            eprintln!("edgeprof-control-plane: token {id} revoked");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edgeprof-control-plane: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgeprof-control-plane: {e:#}");
            ExitCode::FAILURE
        }
    }
}
