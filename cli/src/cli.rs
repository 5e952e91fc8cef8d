//! The command line: clap definitions and the dispatch to each command.

use crate::bench;
use crate::bench::BenchConfig;
use crate::error::CliError;
use crate::remote::Remote;
use crate::store_url::{StoreUrl, DEFAULT_STORE_URL, STORE_URL_ENV};
use crate::target::Target;
use crate::{call, conformance, inspect, keys, mcp, replay, retention, serve};
use clap::{Args, Parser, Subcommand};
use eve_core::engine::Registry;
use eve_core::{InputResponse, JournalStore, Resolution, Timestamp};
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// eve: durable workflow tools for AI agents. Serve them, inspect runs and journals, answer
/// pending requests, and check or measure a store.
#[derive(Debug, Parser)]
#[command(name = "eve", version, about, long_about = None)]
pub struct Cli {
    /// The store: sqlite://PATH, postgres://USER@HOST:PORT/DB[?schema=NAME] or
    /// dynamodb://TABLE?endpoint=URL[&region=REGION].
    #[arg(long, global = true, env = STORE_URL_ENV, default_value = DEFAULT_STORE_URL, value_name = "URL")]
    pub store: String,

    /// Act through the HTTP API of the `eve serve` at this URL (e.g. http://127.0.0.1:8787)
    /// instead of on the store, so keys and scopes apply. The commands that read or act
    /// (runs, journal, requests, answer, agents, cancel, call, keys) print the same as on the
    /// store.
    #[arg(long, global = true, env = "EVE_URL", value_name = "URL")]
    pub url: Option<String>,

    /// With --url: the API key sent (`Authorization: Bearer`). Mind that a flag is visible to
    /// other users of the machine; prefer EVE_KEY or a profile.
    #[arg(
        long,
        global = true,
        env = "EVE_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub key: Option<String>,

    /// Take --url and --key from this profile of the profiles file ($EVE_CONFIG, else
    /// ~/.config/eve/profiles.toml: `[profiles.NAME]` with `url` and `key`); --url / --key
    /// given as well win.
    #[arg(long, global = true, env = "EVE_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,

    /// Log lines on stderr as text or JSON (filter with RUST_LOG, e.g. RUST_LOG=debug).
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: crate::logging::LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The `eve` subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP surface (start API, MCP at /mcp, webhooks, session channel, runs API, the
    /// page) with a worker running this app's tools, until Ctrl-C.
    Serve(ServeArgs),
    /// Serve this app's tools over MCP on stdin/stdout (what a desktop agent host launches),
    /// with a worker, until the client closes stdin. Prints nothing else on stdout.
    Mcp(McpArgs),
    /// Start a call of one of this app's tools on the store; with --wait, wait until it ends and
    /// print its result as JSON.
    Call(CallArgs),
    /// Inspect runs, decide on a blocked one, or purge ended ones.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Print a run's journal, one event per line, webhook tokens masked (`wh_1a2b…`).
    Journal {
        /// The run id.
        run: String,
        /// One JSON object per line instead of the readable form (what `eve replay` reads; a
        /// masked export replays as well).
        #[arg(long)]
        json: bool,
        /// Show webhook tokens whole. Whoever has one can deliver to its run.
        #[arg(long)]
        reveal: bool,
        /// Start at this seq (a long journal is printed a page at a time; `--from` and
        /// `--limit` show one window of it).
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        from: u64,
        /// Print at most this many events.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// List pending input requests (of one session, or of every live run's session).
    Requests {
        /// Only this session's.
        #[arg(long)]
        session: Option<String>,
        /// A JSON array instead of one line per request.
        #[arg(long)]
        json: bool,
    },
    /// Answer a pending input request with an option id, a text, or both.
    Answer {
        /// The request id (see `eve requests`).
        request: String,
        /// The option id to answer with, e.g. approve.
        option: Option<String>,
        /// Free text to answer with.
        #[arg(long)]
        text: Option<String>,
        /// Who answers: recorded in the journal's `InputAnswered` as `answeredBy` and shown on
        /// the page (default: nobody named).
        #[arg(long = "as", value_name = "NAME")]
        answered_by: Option<String>,
    },
    /// Deliver to hooks.
    #[command(subcommand)]
    Hook(HookCommand),
    /// List pending subagent calls (`ctx.agent` without an in-process AgentHost) and report
    /// their results.
    #[command(subcommand)]
    Agents(AgentsCommand),
    /// Look at a session or end it.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// Create, list and revoke the API keys that open `eve serve`'s routes.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Request cancellation of a run or background task.
    Cancel {
        /// The task's (run's) id.
        task: String,
        /// Why.
        #[arg(long, default_value = "cancelled from the eve CLI")]
        reason: String,
    },
    /// Run the store conformance suite against the backend of --store, on fresh isolated
    /// storage (a temp file, a random schema, a random table).
    Conformance {
        /// Which level: the store contract, the engine's fault families over the store, or all.
        #[arg(long, value_enum, default_value = "all")]
        level: conformance::Level,
        /// Only the cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Random sequences of the model-based store case and programs per engine family
        /// (sets EVE_CONFORMANCE_CASES; defaults 32 and the suite's engine default).
        #[arg(long)]
        cases: Option<u32>,
    },
    /// Measure the backend of --store (or compare several with --compare) on fresh storage:
    /// 10-step calls, a 1,000-step run killed and recovered, throughput, webhook latency over
    /// parked runs, memory per parked run, bytes per step and DynamoDB capacity units.
    Bench(BenchArgs),
    /// W2's child process (started by `eve bench` itself).
    #[command(hide = true)]
    BenchChild(BenchChildArgs),
    /// Print a shell completion script: `source <(eve completions bash)`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Check this app's tools against exported journals before deploying: replays each (no
    /// store, no step runs) and says whether it replays cleanly, where the code diverges, or
    /// that its workflow is missing. Exit code 1 if any does not replay.
    Replay {
        /// A journal file (`eve journal RUN --json > RUN.jsonl`; the file name is the run id)
        /// or a directory of *.jsonl journals. Repeatable.
        #[arg(long, required = true, value_name = "PATH")]
        journal: Vec<std::path::PathBuf>,
    },
}

/// `eve serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on (port 0 picks a free one, printed at start).
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// The URL the server is reached at from outside (for webhook URLs and the Host check:
    /// requests naming another host than this or a loopback name get 421); default
    /// http://ADDRESS of --listen. Give it with --listen 0.0.0.0:PORT. Bodies see it as the
    /// environment variable EVE_BASE_URL (set from this option; without it, an EVE_BASE_URL
    /// already set is kept, else the listen address is used).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Also run the demo: a scripted agent calls `deploy`, which asks for approval; prints the
    /// page's URL and the `eve answer` command, and stops once the run has finished.
    #[arg(long)]
    pub demo: bool,
    /// With --demo: keep serving after the demo's run has finished.
    #[arg(long, requires = "demo")]
    pub keep_serving: bool,
    /// The worker's id. Default: {host}/{deployment}, stable across restarts, so a restarted
    /// process takes its predecessor's runs back at once. Give each process of one deployment
    /// on one host its own: a second live process with the same id refuses to start and names
    /// the first (pid, host, since when); the first keeps serving.
    #[arg(long, env = "EVE_WORKER_ID", value_name = "ID")]
    pub worker_id: Option<String>,
    /// Serve every route without an API key. For tests only: anyone who reaches the server
    /// reads every journal, answers every request and cancels every task; answers record no
    /// `answeredBy`.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Keep ended runs this long (e.g. 30d, 12h): purge runs that ended earlier at start and
    /// every hour, logging how many. Live runs are never purged. Default: keep everything.
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
    pub retain: Option<Duration>,
    /// A webhook request header to leave out of the journal (case-insensitive; repeatable),
    /// beside the built-in rule: authorization, proxy-authorization, cookie, x-api-key and
    /// names ending in -token, -secret, -password, -passwd, -api-key, -apikey, -credential(s).
    #[arg(long = "webhook-drop-header", value_name = "NAME", value_parser = header_name)]
    pub webhook_drop_headers: Vec<String>,
    /// A header the rule leaves out, journaled anyway for a tool that checks it, e.g.
    /// x-gitlab-token (repeatable). Anyone with a read key then sees its value.
    #[arg(long = "webhook-keep-header", value_name = "NAME", value_parser = header_name)]
    pub webhook_keep_headers: Vec<String>,
    /// Export the runs' spans over OTLP/HTTP to this collector (e.g. http://127.0.0.1:4318;
    /// /v1/traces is added). Without it, traces are exported when OTEL_EXPORTER_OTLP_ENDPOINT
    /// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, and not at all otherwise.
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

/// An HTTP header name, lower-cased: 1 or more token characters (RFC 9110).
fn header_name(s: &str) -> Result<String, String> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if s.is_empty() || !s.bytes().all(tchar) {
        return Err(format!(
            "{s:?} is not an HTTP header name (letters, digits and -, e.g. x-vendor-token)"
        ));
    }
    Ok(s.to_ascii_lowercase())
}

/// `eve call` options.
#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool's name (see `eve serve`'s tool list or GET /v1/tools).
    pub tool: String,
    /// The input, a JSON object, e.g. '{"service": "api"}'.
    #[arg(long, value_name = "JSON")]
    pub input: String,
    /// The session the call belongs to.
    #[arg(long, default_value = "cli", value_name = "S")]
    pub session: String,
    /// The call id. With the session it is the start's idempotency key: the same session and
    /// call id again return the run they started. Default: a fresh id.
    #[arg(long, value_name = "ID")]
    pub call_id: Option<String>,
    /// Wait until the run ends (at most DURATION, e.g. 30s; no limit without one) and print its
    /// result as the last line.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub wait: Option<Option<Duration>>,
    /// With --wait: run a worker for this app in this process while waiting, for when no
    /// `eve serve` runs this deployment.
    #[arg(long, requires = "wait")]
    pub worker: bool,
}

/// `eve mcp` options.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The worker's id. Default: {host}/{deployment}/mcp-{pid}: an agent host may launch several
    /// `eve mcp` processes at once, and each must run its own worker (they share the store;
    /// runs of a process that died are taken back by the others once its lease expires).
    #[arg(long, env = "EVE_WORKER_ID", value_name = "ID")]
    pub worker_id: Option<String>,
    /// Keep ended runs this long (e.g. 30d): purge runs that ended earlier at start and every
    /// hour, reported on stderr. Live runs are never purged. Default: keep everything.
    #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
    pub retain: Option<Duration>,
    /// Export the runs' spans over OTLP/HTTP to this collector, as `eve serve --otlp`
    /// (default: the OTEL_EXPORTER_OTLP_* variables; off when none is set).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

/// `eve bench` options.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Measure these stores side by side, interleaved (each workload on every store in turn),
    /// instead of --store: e.g. `--compare sqlite://eve.db postgres://… dynamodb://…`.
    #[arg(long, num_args = 1.., value_name = "URL")]
    pub compare: Vec<String>,
    /// Tiny sizes (seconds; the figures mean nothing): a smoke test of every workload.
    #[arg(long)]
    pub quick: bool,
    /// Print the figures as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measurement rounds; the figures are medians over them.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// W1: calls per caller (default 100; --quick 3).
    #[arg(long)]
    pub calls: Option<u32>,
    /// W2: steps of the run killed in its last step (default 1000; --quick 20).
    #[arg(long)]
    pub w2_steps: Option<u32>,
    /// Runs started at once for the throughput figure (default 64; --quick 4).
    #[arg(long)]
    pub runs: Option<u32>,
    /// No-op steps of each of those runs (default 50; --quick 5).
    #[arg(long)]
    pub steps_per_run: Option<u32>,
    /// Runs parked on a webhook for the webhook latency (default 1000; --quick 5).
    #[arg(long)]
    pub webhook_runs: Option<u32>,
    /// Webhook POSTs per second (default 200; --quick 100).
    #[arg(long)]
    pub webhook_rate: Option<u32>,
    /// Runs parked on a sleep for the memory figure (default 5000; --quick 10).
    #[arg(long)]
    pub parked_runs: Option<u32>,
    /// DynamoDB on-demand price, USD per million write request units (default: us-east-1).
    #[arg(long, default_value_t = bench::DYNAMODB_WRITE_PRICE)]
    pub dynamodb_write_price: f64,
    /// DynamoDB on-demand price, USD per million read request units (default: us-east-1).
    #[arg(long, default_value_t = bench::DYNAMODB_READ_PRICE)]
    pub dynamodb_read_price: f64,
}

impl BenchArgs {
    /// The sizes these options ask for.
    pub fn config(&self) -> BenchConfig {
        let base = if self.quick {
            BenchConfig::quick()
        } else {
            BenchConfig::default()
        };
        BenchConfig {
            calls: self.calls.unwrap_or(base.calls),
            w2_steps: self.w2_steps.unwrap_or(base.w2_steps).max(1),
            runs: self.runs.unwrap_or(base.runs),
            steps_per_run: self.steps_per_run.unwrap_or(base.steps_per_run),
            webhook_runs: self.webhook_runs.unwrap_or(base.webhook_runs),
            webhook_rate: self.webhook_rate.unwrap_or(base.webhook_rate).max(1),
            parked_runs: self.parked_runs.unwrap_or(base.parked_runs),
            rounds: self.rounds.max(1),
            write_price: self.dynamodb_write_price,
            read_price: self.dynamodb_read_price,
            json: self.json,
        }
    }
}

/// The hidden `eve bench-child`: W2's child process.
#[derive(Debug, Args)]
pub struct BenchChildArgs {
    /// The bench's storage beside --store (a file, a schema, a table).
    #[arg(long)]
    pub location: String,
    /// The worker id (the recovering process reuses the killed one's).
    #[arg(long)]
    pub worker_id: String,
    /// Steps of the run to start.
    #[arg(long, default_value_t = 0)]
    pub steps: u32,
    /// Announce this step on stdout and wait in it to be killed.
    #[arg(long, default_value_t = 0)]
    pub kill_at: u32,
    /// Finish this run instead of starting one.
    #[arg(long)]
    pub recover: Option<String>,
    /// Instead: park this many runs on a sleep and print this process's RSS growth per run.
    #[arg(long)]
    pub parked: Option<u32>,
}

/// `eve runs …`.
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first (--oldest-first for the other way), one page at a time.
    List {
        /// Which runs.
        #[command(flatten)]
        filters: RunFilterArgs,
        /// Oldest first (default: newest first); page on with --after.
        #[arg(long)]
        oldest_first: bool,
        /// Newest first: the page of runs older than this one (printed at the end of the
        /// previous page).
        #[arg(long, value_name = "RUN", conflicts_with = "oldest_first")]
        before: Option<String>,
        /// With --oldest-first: the page of runs newer than this one (printed at the end of the
        /// previous page).
        #[arg(long, value_name = "RUN", requires = "oldest_first")]
        after: Option<String>,
        /// At most this many (0: all).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object ({"runs", "next", "counts"}) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Show one run: its record, pending requests and outcome.
    Show {
        /// The run id.
        run: String,
        /// One JSON object ({"run", "pending", "outcome"}).
        #[arg(long)]
        json: bool,
        /// Then print its journal, one event a line (with --json one JSON object a line), and
        /// each new event as the run writes it, until it ends.
        #[arg(long)]
        follow: bool,
    },
    /// Make a blocked run claimable again (after a fix was deployed).
    Resume {
        /// The run id.
        run: String,
    },
    /// End a blocked run failed, settling its tool call.
    Fail {
        /// The run id.
        run: String,
        /// The error the call is settled with.
        #[arg(long)]
        error: String,
    },
    /// Delete runs that ended (completed, failed, cancelled) more than AGE ago, with their
    /// journals, requests, hook records and session-log entries. Live runs are never touched.
    Purge {
        /// How long ago, e.g. 30d, 12h, 90m.
        #[arg(long, value_name = "AGE", value_parser = humantime::parse_duration)]
        ended_before: Duration,
    },
    /// Cancel a run, or every live run a filter selects: a cooperative cancel (its body gets
    /// its grace period; cleanup steps run).
    Cancel {
        /// The run id; without it, the runs the filters select.
        run: Option<String>,
        /// Why.
        #[arg(long, default_value = "cancelled from the eve CLI")]
        reason: String,
        /// The filters and confirmations of a batch.
        #[command(flatten)]
        batch: BatchArgs,
    },
    /// End a live run at once (running, parked or blocked), or every live run a filter
    /// selects: no grace period, no cleanup steps; its pending requests are withdrawn and its
    /// call settles failed ("terminated by WHO: WHY").
    Terminate {
        /// The run id; without it, the runs the filters select.
        run: Option<String>,
        /// Why (recorded in the journal and the call's error).
        #[arg(long)]
        reason: String,
        /// Who terminates it (default: $USER). On the store only: over HTTP the server
        /// records the key's name.
        #[arg(long = "as", value_name = "WHO")]
        by: Option<String>,
        /// The filters and confirmations of a batch.
        #[command(flatten)]
        batch: BatchArgs,
    },
    /// Run a failed run again as a new run from its journal: cut at the first attempt of the
    /// step that failed it (that step gets all its attempts again; the steps completed before
    /// it are replayed, not executed), or where its end begins when no step failed. The new
    /// run is pinned to this binary's deployment when it has the workflow (a retry after a fix
    /// runs the fixed code). Idempotent: the same retry again prints the same new run. The old
    /// run and its journal are kept.
    Retry {
        /// The failed run.
        run: String,
        /// Pin the new run to this deployment instead.
        #[arg(long, value_name = "ID")]
        deployment: Option<String>,
        /// JSON: `{"run", "created", "from": {"run", "seq"}, "copied"}`.
        #[arg(long)]
        json: bool,
    },
    /// Start a new run from an ended run's journal cut at seq SEQ (as Temporal's reset): its
    /// events before SEQ are copied (request ids rewritten), the body replays them and goes on
    /// from there; `eve journal RUN` shows the seqs. 1 runs the body from the start. The old
    /// run and its journal are kept; the same reset again prints the same new run. A live run
    /// is refused: terminate or cancel it first.
    Reset {
        /// The ended run.
        run: String,
        /// The cut: copy the events with 0 < seq < SEQ.
        #[arg(long, value_name = "SEQ")]
        to: u64,
        /// Pin the new run to this deployment instead.
        #[arg(long, value_name = "ID")]
        deployment: Option<String>,
        /// JSON: `{"run", "created", "from": {"run", "seq"}, "copied"}`.
        #[arg(long)]
        json: bool,
    },
}

/// The filters of `eve runs list`, `eve runs cancel` and `eve runs terminate`.
#[derive(Debug, Args)]
pub struct RunFilterArgs {
    /// Only this session's runs.
    #[arg(long)]
    session: Option<String>,
    /// Only runs in this status: running, blocked, completed, failed, cancelled (a batch acts
    /// on live runs only).
    #[arg(long)]
    status: Option<String>,
    /// Only runs of this tool.
    #[arg(long)]
    tool: Option<String>,
    /// Only runs created within this long before now, e.g. 2h, 7d.
    #[arg(long, value_name = "DURATION")]
    since: Option<String>,
    /// Only runs created more than this long before now.
    #[arg(long, value_name = "DURATION")]
    until: Option<String>,
    /// Only runs matching this search on input fields and attributes (set by the body with
    /// `ctx.set_attributes`), e.g. 'input.service = "api" and attr.region = "eu" and
    /// attr.cost >= 10': paths input.<field>… and attr.<key>; =, !=, <, <=, >, >=; quoted
    /// strings, numbers, true, false; joined by `and`.
    // The help text shows `<field>` and `<key>` as written, not as HTML.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "QUERY")]
    query: Option<String>,
}

impl RunFilterArgs {
    fn given(&self) -> bool {
        self.session.is_some()
            || self.status.is_some()
            || self.tool.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.query.is_some()
    }

    /// The session and the store filter these flags select, durations counted back from `now`.
    fn to_filter(
        &self,
        now: Timestamp,
    ) -> Result<(Option<eve_core::SessionId>, eve_core::RunFilter), CliError> {
        let ago = |d: &Option<String>, flag: &str| -> Result<Option<Timestamp>, CliError> {
            d.as_deref()
                .map(|d| {
                    eve_core::engine::parse_duration(d)
                        .map(|d| Timestamp(now.millis() - d.as_millis() as i64))
                        .map_err(|e| CliError::Usage(format!("{flag}: {e}")))
                })
                .transpose()
        };
        let filter = eve_core::RunFilter {
            status: self
                .status
                .as_deref()
                .map(inspect::parse_status)
                .transpose()?,
            tool: self.tool.clone(),
            since: ago(&self.since, "--since")?,
            until: ago(&self.until, "--until")?,
            query: self
                .query
                .as_deref()
                .map(eve_core::RunSearch::parse)
                .transpose()
                .map_err(|e| CliError::Usage(format!("--query: {e}")))?,
            ..eve_core::RunFilter::default()
        };
        Ok((self.session.clone().map(eve_core::SessionId::new), filter))
    }
}

/// The filters and confirmations of `eve runs cancel|terminate` without a run id.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Which runs.
    #[command(flatten)]
    filters: RunFilterArgs,
    /// Without a filter: every live run.
    #[arg(long)]
    all: bool,
    /// Print how many runs and which would be acted on; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Act without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
    /// JSON: one result object for a run id, an array of per-run results for a batch.
    #[arg(long)]
    json: bool,
}

impl BatchArgs {
    fn given(&self) -> bool {
        self.filters.given() || self.all || self.dry_run || self.yes
    }
}

/// `eve sessions …`.
#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Whether the session ended, its queued messages and its runs (oldest first).
    Show {
        /// The session id.
        session: String,
        /// One JSON object ({"session", "runs"}).
        #[arg(long)]
        json: bool,
    },
    /// End the session (no new call starts in it) and request cancellation of its runs that
    /// have not ended.
    End {
        /// The session id.
        session: String,
    },
}

/// `eve agents …`.
#[derive(Debug, Subcommand)]
pub enum AgentsCommand {
    /// List pending subagent calls (of one session, or of every live run's session).
    List {
        /// Only this session's.
        #[arg(long)]
        session: Option<String>,
        /// A JSON array instead of one line per call.
        #[arg(long)]
        json: bool,
    },
    /// Report the result of a pending subagent call: its output (checked against the call's
    /// output schema before anything is recorded) or why it failed.
    Complete {
        /// The call's request id (see `eve agents list`).
        id: String,
        /// The child's output, as JSON.
        #[arg(long, conflicts_with = "error", required_unless_present = "error")]
        output: Option<String>,
        /// Why the child failed.
        #[arg(long)]
        error: Option<String>,
        /// Who reports it: recorded as `answeredBy` (default: nobody named).
        #[arg(long = "as", value_name = "NAME")]
        answered_by: Option<String>,
    },
}

/// `eve hook …`.
#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Deliver a JSON payload to the live hook of a token (with --url, through the server's
    /// POST /v1/hooks/{token}: a key of scope operate).
    Resume {
        /// The hook's token.
        token: String,
        /// The payload, as JSON.
        json: String,
        /// Dedupe key: a retry with the same key is delivered once (sent as Idempotency-Key
        /// with --url).
        #[arg(long, value_name = "KEY")]
        dedupe_key: Option<String>,
    },
}

impl Cli {
    /// The parsed `--store` URL.
    ///
    /// # Errors
    /// [`CliError::BadUrl`].
    pub fn store_url(&self) -> Result<StoreUrl, CliError> {
        Ok(self.store.parse()?)
    }
}

/// Opens the store of `--store` for a command that reads or acts on what is there: a SQLite
/// file that does not exist is refused (with its absolute path), never created empty.
async fn open(cli: &Cli) -> Result<Arc<dyn JournalStore>, CliError> {
    Ok(cli.store_url()?.open_existing().await?)
}

/// Opens (creating) the store of `--store`, for a command that may be the first on it.
async fn open_or_create(cli: &Cli) -> Result<Arc<dyn JournalStore>, CliError> {
    Ok(cli.store_url()?.open().await?)
}

/// The server of `--url` / `EVE_URL` or `--profile`, if one is given.
fn remote(cli: &Cli) -> Result<Option<Remote>, CliError> {
    let profile = match cli.profile.as_deref().filter(|p| !p.is_empty()) {
        Some(name) => {
            let path = crate::profile::config_path().ok_or_else(|| {
                CliError::Usage(format!(
                    "--profile {name}: no profiles file (set {} or HOME)",
                    crate::profile::CONFIG_ENV
                ))
            })?;
            Some(crate::profile::load(&path, name)?)
        }
        None => None,
    };
    let url = cli
        .url
        .clone()
        .filter(|u| !u.is_empty())
        .or_else(|| profile.as_ref().map(|p| p.url.clone()));
    let key = cli.key.clone().or_else(|| profile.and_then(|p| p.key));
    url.map(|u| Remote::new(&u, key).map_err(CliError::Unreachable))
        .transpose()
}

/// `eve runs retry` (`to` none) and `eve runs reset --to`.
async fn runs_reset(
    cli: &Cli,
    run: &str,
    to: Option<u64>,
    deployment: &Option<String>,
    registry: &Registry,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let deployment = deployment.clone().map(eve_core::DeploymentId::new);
    let verb = if to.is_some() { "reset" } else { "retry" };
    let r = target(cli)
        .await?
        .reset(
            &eve_core::RunId::new(run),
            to,
            deployment.as_ref(),
            registry,
            Timestamp::now(),
        )
        .await
        .map_err(CliError::at(format!("cannot {verb} {run}")))?;
    print_reset(&r, json, out);
    Ok(())
}

/// `eve runs cancel|terminate`: one run by id, or a batch by filter.
async fn runs_action(
    cli: &Cli,
    run: Option<&str>,
    action: &crate::batch::Action,
    batch: &BatchArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let target = target(cli).await?;
    if let Some(run) = run {
        if batch.given() {
            return Err(CliError::Usage(
                "give a run id or filters (--status, --session, --tool, --since, --until, --all), not both".into(),
            ));
        }
        return crate::batch::one(&target, run, action, batch.json, Timestamp::now(), out).await;
    }
    let (session, filter) = batch.filters.to_filter(Timestamp::now())?;
    let selection = crate::batch::Selection {
        session,
        filter,
        all: batch.all,
    };
    let confirm = crate::batch::Confirm {
        dry_run: batch.dry_run,
        yes: batch.yes,
    };
    crate::batch::batch(
        &target,
        &selection,
        action,
        confirm,
        batch.json,
        Timestamp::now(),
        out,
    )
    .await
}

/// Prints what `eve runs retry|reset` did: the new run's id first.
fn print_reset(r: &eve_core::ResetOutcome, json: bool, out: &mut dyn Write) {
    let _ = if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "run": r.run.run_id,
                "created": r.created,
                "from": r.from,
                "copied": r.copied,
                "status": r.run.status,
                "deployment": r.run.deployment_id,
            })
        )
    } else {
        writeln!(
            out,
            "{}\t{} from {} at seq {} ({} event(s) copied, deployment {})",
            r.run.run_id,
            if r.created { "new run" } else { "already made" },
            r.from.run,
            r.from.seq,
            r.copied,
            r.run.deployment_id
        )
    };
}

/// Where a command that reads or acts goes: the server of `--url`, else the store of
/// `--store` (which must exist).
async fn target(cli: &Cli) -> Result<Target, CliError> {
    Ok(match remote(cli)? {
        Some(r) => Target::Remote(r),
        None => Target::Local(open(cli).await?),
    })
}

/// Refuses `--url` for a command that has no HTTP route: it would act on a local store while
/// the operator means the server's.
fn local_only(cli: &Cli, command: &str) -> Result<(), CliError> {
    match remote(cli)? {
        Some(r) => Err(CliError::Usage(format!(
            "{command} acts on the store only; drop --url / EVE_URL / --profile ({}) and give --store",
            r.url()
        ))),
        None => Ok(()),
    }
}

/// Runs the parsed command for the tools of `registry`, writing its output to `out`.
///
/// # Errors
/// The command's [`CliError`].
pub async fn run(cli: Cli, registry: &Registry, out: &mut dyn Write) -> Result<(), CliError> {
    let store = cli.store_url().map(|u| u.to_string()).unwrap_or_default();
    dispatch(cli, registry, out)
        .await
        .map_err(|e| e.naming_store(&store))
}

async fn dispatch(cli: Cli, registry: &Registry, out: &mut dyn Write) -> Result<(), CliError> {
    let now = Timestamp::now;
    match &cli.command {
        Command::Serve(args) => serve::run(&cli.store_url()?, args, registry, out).await,
        Command::Mcp(args) => mcp::run(&cli.store_url()?, args, registry).await,
        Command::Call(args) => {
            let req = call::CallRequest {
                tool: args.tool.clone(),
                input: args.input.clone(),
                session: args.session.clone(),
                call_id: args
                    .call_id
                    .clone()
                    .unwrap_or_else(|| format!("call-{}", uuid::Uuid::new_v4().simple())),
                wait: args.wait,
                worker: args.worker,
            };
            match remote(&cli)? {
                Some(r) => call::run_remote(&r, &req, out).await,
                None => call::run(open_or_create(&cli).await?, registry, &req, out).await,
            }
        }
        Command::Runs(RunsCommand::Purge { ended_before }) => {
            local_only(&cli, "eve runs purge")?;
            retention::runs_purge(&*open(&cli).await?, *ended_before, now(), out).await
        }
        Command::Runs(RunsCommand::List {
            filters,
            oldest_first,
            before,
            after,
            limit,
            json,
        }) => {
            let (session, filter) = filters.to_filter(now())?;
            let filter = eve_core::RunFilter {
                newest_first: !oldest_first,
                // One cursor in the filter, named on the command line for its direction.
                before: before.clone().or(after.clone()).map(eve_core::RunId::new),
                limit: *limit,
                ..filter
            };
            inspect::runs_list(&target(&cli).await?, session, &filter, *json, out).await
        }
        Command::Runs(RunsCommand::Show { run, json, follow }) => {
            let target = target(&cli).await?;
            inspect::runs_show(&target, run, *json, out).await?;
            if *follow {
                inspect::follow(&target, run, *json, out).await?;
            }
            Ok(())
        }
        Command::Runs(RunsCommand::Resume { run }) => {
            inspect::resolve(&target(&cli).await?, run, Resolution::Resume, now(), out).await
        }
        Command::Runs(RunsCommand::Fail { run, error }) => {
            let resolution = Resolution::Fail {
                error: error.clone(),
            };
            inspect::resolve(&target(&cli).await?, run, resolution, now(), out).await
        }
        Command::Runs(RunsCommand::Cancel { run, reason, batch }) => {
            let action = crate::batch::Action::Cancel {
                reason: reason.clone(),
            };
            runs_action(&cli, run.as_deref(), &action, batch, out).await
        }
        Command::Runs(RunsCommand::Retry {
            run,
            deployment,
            json,
        }) => runs_reset(&cli, run, None, deployment, registry, *json, out).await,
        Command::Runs(RunsCommand::Reset {
            run,
            to,
            deployment,
            json,
        }) => runs_reset(&cli, run, Some(*to), deployment, registry, *json, out).await,
        Command::Runs(RunsCommand::Terminate {
            run,
            reason,
            by,
            batch,
        }) => {
            if by.is_some() && remote(&cli)?.is_some() {
                return Err(CliError::Usage(
                    "--as works on the store only (without --url): over HTTP the server records the key's name".into(),
                ));
            }
            if reason.trim().is_empty() {
                return Err(CliError::Usage("--reason must say why".into()));
            }
            let by = by
                .clone()
                .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
                .unwrap_or_else(|| "operator".to_owned());
            let action = crate::batch::Action::Terminate {
                reason: reason.clone(),
                by,
            };
            runs_action(&cli, run.as_deref(), &action, batch, out).await
        }
        Command::Journal {
            run,
            json,
            reveal,
            from,
            limit,
        } => {
            if *reveal && remote(&cli)?.is_some() {
                return Err(CliError::Usage(
                    "--reveal works on the store only (without --url): the HTTP API never shows webhook tokens".into(),
                ));
            }
            inspect::journal_range(
                &target(&cli).await?,
                run,
                *from,
                *limit,
                *json,
                *reveal,
                out,
            )
            .await
        }
        Command::Requests { session, json } => {
            inspect::requests(&target(&cli).await?, session.clone(), *json, out).await
        }
        Command::Answer {
            request,
            option,
            text,
            answered_by,
        } => {
            if answered_by.is_some() && remote(&cli)?.is_some() {
                return Err(CliError::Usage(
                    "--as works on the store only (without --url): over HTTP the server records the key's name".into(),
                ));
            }
            let target = target(&cli).await?;
            let response = InputResponse {
                option_id: option.clone(),
                text: text.clone(),
                answered_by: answered_by.clone(),
                agent: None,
            };
            inspect::answer(&target, request, response, now(), out).await
        }
        Command::Sessions(SessionsCommand::Show { session, json }) => {
            inspect::session_show(&target(&cli).await?, session, *json, out).await
        }
        Command::Sessions(SessionsCommand::End { session }) => {
            inspect::session_end(&target(&cli).await?, session, now(), out).await
        }
        Command::Agents(AgentsCommand::List { session, json }) => {
            inspect::agents(&target(&cli).await?, session.clone(), *json, out).await
        }
        Command::Agents(AgentsCommand::Complete {
            id,
            output,
            error,
            answered_by,
        }) => {
            let reply = match (output, error) {
                (Some(o), _) => eve_core::AgentReply::Output(
                    serde_json::from_str(o)
                        .map_err(|e| CliError::Usage(format!("--output is not JSON: {e}")))?,
                ),
                (None, Some(e)) => eve_core::AgentReply::Error(e.clone()),
                (None, None) => {
                    return Err(CliError::Usage(
                        "give --output JSON or --error \"why\"".into(),
                    ))
                }
            };
            let response = InputResponse {
                answered_by: answered_by.clone(),
                agent: Some(reply),
                ..InputResponse::default()
            };
            inspect::complete_agent(&target(&cli).await?, id, response, now(), out).await
        }
        Command::Hook(HookCommand::Resume {
            token,
            json,
            dedupe_key: key,
        }) => {
            let target = target(&cli).await?;
            inspect::hook_resume(&target, token, json, key.as_deref(), now(), out).await
        }
        Command::Keys(command) => {
            // Creating a key may come before anything else, as on a fresh deployment.
            let target = match (remote(&cli)?, command) {
                (Some(r), _) => Target::Remote(r),
                (None, keys::KeysCommand::Create { .. }) => {
                    Target::Local(open_or_create(&cli).await?)
                }
                (None, _) => Target::Local(open(&cli).await?),
            };
            keys::run(&target, command, now(), out).await
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let name = std::env::args_os()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "eve".into());
            clap_complete::generate(*shell, &mut cmd, name, out);
            Ok(())
        }
        Command::Cancel { task, reason } => {
            inspect::cancel(&target(&cli).await?, task, reason, now(), out).await
        }
        #[cfg(feature = "conformance")]
        Command::Conformance { level, filter, .. } => {
            conformance::run(&cli.store_url()?, *level, filter.as_deref(), out)
                .await
                .map(drop)
        }
        #[cfg(not(feature = "conformance"))]
        Command::Conformance { .. } => Err(CliError::NotCompiled {
            what: "`eve conformance`",
            feature: "conformance",
        }),
        Command::Replay { journal } => replay::run(journal, registry, out),
        #[cfg(not(feature = "conformance"))]
        Command::Bench(_) | Command::BenchChild(_) => Err(CliError::NotCompiled {
            what: "`eve bench`",
            feature: "conformance",
        }),
        #[cfg(feature = "conformance")]
        Command::Bench(args) => {
            let urls = if args.compare.is_empty() {
                vec![cli.store.clone()]
            } else {
                args.compare.clone()
            };
            bench::run(&urls, args.config(), out).await.map(drop)
        }
        #[cfg(feature = "conformance")]
        Command::BenchChild(args) => {
            use eve_conformance::StoreFactory;
            let factory = crate::factory::UrlFactory::new(cli.store_url()?)
                .map_err(CliError::store("cannot make a temp dir"))?;
            let store = factory
                .open(&args.location)
                .await
                .map_err(CliError::store("cannot open the bench storage"))?
                .ok_or_else(|| CliError::Bench("the bench storage cannot be reopened".into()))?;
            if let Some(runs) = args.parked {
                return bench::parked_child(store, args.worker_id.clone(), runs, out).await;
            }
            bench::child(
                store,
                args.worker_id.clone(),
                args.steps,
                args.kill_at,
                args.recover.clone(),
                out,
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn webhook_header_flags_repeat_and_check_names() {
        let cli = Cli::try_parse_from([
            "eve",
            "serve",
            "--webhook-drop-header",
            "X-Vendor-Sig",
            "--webhook-drop-header",
            "x-other",
            "--webhook-keep-header",
            "X-Gitlab-Token",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.webhook_drop_headers, ["x-vendor-sig", "x-other"]);
        assert_eq!(args.webhook_keep_headers, ["x-gitlab-token"]);
        let err = Cli::try_parse_from(["eve", "serve", "--webhook-drop-header", "x bad:"])
            .expect_err("not a header name");
        assert!(err.to_string().contains("not an HTTP header name"), "{err}");
    }
}
