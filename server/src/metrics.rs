//! `/metrics` in the Prometheus text format, and the access log: one line per HTTP request.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `eve_http_requests_total` | counter | `method`, `route` (the route pattern, never an id or token), `status` |
//! | `eve_http_request_duration_seconds` | histogram | `route` |
//! | `eve_webhook_deliveries_total` | counter | `outcome`: delivered, duplicate, unknown, refused, failed |
//! | `eve_answers_total` | counter | `outcome`: accepted, duplicate, refused; `surface`: http (an `Authorization: Bearer` key: the API, the remote CLI), page (the page's cookie) |
//! | `eve_terminates_total` | counter | `outcome`: terminated, not_live (the run had ended: nothing written); `surface`: http, page |
//! | `eve_resets_total` | counter | `kind`: retry, reset; `outcome`: created, repeated (the same reset was made before: nothing written), not_ended (a live run), refused (a bad cut, a run that did not fail, a failed copy); `surface`: http, page |
//! | `eve_call_settle_seconds` | histogram | `tool`, `outcome` (completed, failed, cancelled, denied): from a call's start (its run's creation) to the end event that settles it |
//! | `eve_runs` | gauge, read at scrape | `status` |
//! | `eve_pending_requests` | gauge, read at scrape | — |
//! | `eve_steps_total` | counter | `name` (the step's name) |
//! | `eve_step_duration_seconds` | histogram | — |
//! | `eve_activation_duration_seconds` | histogram | — |
//!
//! What is counted where: an answer is counted by the server that records it (`surface`
//! http or page). Answers written to the store without this server are not: `eve answer`
//! without `--url` (it writes to the store directly; give `--url` to have it counted as http),
//! MCP elicitation answers (the MCP endpoint answers through the store) and in-process
//! `Session` answers. Terminates likewise: counted by the server whose route
//! (`POST /v1/runs/{id}/terminate`, which the remote `eve runs terminate` uses) wrote them; `eve
//! runs terminate` without `--url` writes to the store directly and is not. Retries and resets
//! likewise: counted by the server whose route (`POST /v1/runs/{id}/retry`, `…/reset`, which the
//! remote `eve runs retry|reset` use) made them, whichever surface (http, page) called it; `eve
//! runs retry|reset` without `--url` writes to the store directly and is not counted.
//! Call-to-settle latency is observed when this process's worker writes a
//! run's end event (from the worker's `activation` span and its end log line), so it counts
//! every call a worker settles, whichever surface started or answered it; a run ended without
//! a worker (`eve runs fail` of a blocked run, a session ended with a blocked run) is not
//! observed. Both are measured on the wall clock.
//!
//! Steps and activations are measured from the engine's `step` and `activation` tracing spans
//! by [`Metrics::layer`], so they count only when the worker runs in the same process and that
//! layer is part of its tracing subscriber (as in `eve serve`). The gauges are read from the
//! store at each scrape (one run listing per status, one pending-request query per live
//! session), so scrape a large store sparingly.

use crate::Inner;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use eve_core::{RunQuery, RunStatus, SessionId};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

type Labels = Vec<(&'static str, String)>;

/// Call-to-settle latency: 10 ms to about a day (a call may wait hours for an answer).
fn settle_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 24))
}

fn seconds_histogram() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The server's and the worker's metrics. Share one between [`crate::AppState::with_metrics`]
/// and the tracing subscriber ([`Metrics::layer`]).
pub struct Metrics {
    registry: Registry,
    http: Family<Labels, Counter>,
    http_latency: Family<Labels, Histogram>,
    webhooks: Family<Labels, Counter>,
    answers: Family<Labels, Counter>,
    terminates: Family<Labels, Counter>,
    resets: Family<Labels, Counter>,
    settle: Family<Labels, Histogram>,
    runs: Family<Labels, Gauge>,
    pending: Gauge,
    steps: Family<Labels, Counter>,
    step_latency: Histogram,
    activation_latency: Histogram,
    /// Serializes scrapes, so two at once do not interleave their gauge updates.
    scrape: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let http = Family::<Labels, Counter>::default();
        let http_latency = Family::<Labels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        let webhooks = Family::<Labels, Counter>::default();
        let answers = Family::<Labels, Counter>::default();
        let terminates = Family::<Labels, Counter>::default();
        let resets = Family::<Labels, Counter>::default();
        let settle = Family::<Labels, Histogram>::new_with_constructor(
            settle_histogram as fn() -> Histogram,
        );
        let runs = Family::<Labels, Gauge>::default();
        let pending = Gauge::default();
        let steps = Family::<Labels, Counter>::default();
        let step_latency = seconds_histogram();
        let activation_latency = seconds_histogram();
        registry.register("eve_http_requests", "HTTP requests answered", http.clone());
        registry.register(
            "eve_http_request_duration_seconds",
            "Time to answer an HTTP request (an event stream: to its first byte)",
            http_latency.clone(),
        );
        registry.register(
            "eve_webhook_deliveries",
            "Webhook requests by outcome",
            webhooks.clone(),
        );
        registry.register(
            "eve_answers",
            "Answers to input requests by outcome",
            answers.clone(),
        );
        registry.register(
            "eve_terminates",
            "Operator terminates by outcome",
            terminates.clone(),
        );
        registry.register(
            "eve_resets",
            "Operator retries and resets of ended runs by kind and outcome",
            resets.clone(),
        );
        registry.register(
            "eve_call_settle_seconds",
            "Time from a call's start to the end event that settles it, per tool and outcome (runs ended by this process's worker)",
            settle.clone(),
        );
        registry.register(
            "eve_runs",
            "Runs by status, read from the store at scrape",
            runs.clone(),
        );
        registry.register(
            "eve_pending_requests",
            "Input requests waiting for an answer, read from the store at scrape",
            pending.clone(),
        );
        registry.register(
            "eve_steps",
            "Step executions (attempts) run by this process",
            steps.clone(),
        );
        registry.register(
            "eve_step_duration_seconds",
            "Duration of one step attempt",
            step_latency.clone(),
        );
        registry.register(
            "eve_activation_duration_seconds",
            "Duration of one activation (replay and run of a claimed run)",
            activation_latency.clone(),
        );
        Self {
            registry,
            http,
            http_latency,
            webhooks,
            answers,
            terminates,
            resets,
            settle,
            runs,
            pending,
            steps,
            step_latency,
            activation_latency,
            scrape: tokio::sync::Mutex::new(()),
        }
    }
}

impl Metrics {
    /// Fresh metrics, every counter at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A tracing layer that measures the engine's `step` and `activation` spans into these
    /// metrics. Add it to the subscriber of the process that runs the worker.
    pub fn layer(self: &Arc<Self>) -> SpanMetrics {
        SpanMetrics {
            metrics: self.clone(),
        }
    }

    pub(crate) fn webhook(&self, outcome: &'static str) {
        self.webhooks
            .get_or_create(&vec![("outcome", outcome.to_owned())])
            .inc();
    }

    pub(crate) fn answer(&self, outcome: &'static str, surface: Surface) {
        self.answers
            .get_or_create(&vec![
                ("outcome", outcome.to_owned()),
                ("surface", surface.as_str().to_owned()),
            ])
            .inc();
    }

    pub(crate) fn terminate(&self, outcome: &'static str, surface: Surface) {
        self.terminates
            .get_or_create(&vec![
                ("outcome", outcome.to_owned()),
                ("surface", surface.as_str().to_owned()),
            ])
            .inc();
    }

    /// Counts a retry or reset (`kind`) by outcome and surface.
    pub(crate) fn reset(&self, kind: &'static str, outcome: &'static str, surface: Surface) {
        self.resets
            .get_or_create(&vec![
                ("kind", kind.to_owned()),
                ("outcome", outcome.to_owned()),
                ("surface", surface.as_str().to_owned()),
            ])
            .inc();
    }

    /// Observes a call settled `outcome` after `seconds` (see the module docs).
    fn settled(&self, tool: &str, outcome: &str, seconds: f64) {
        self.settle
            .get_or_create(&vec![
                ("tool", tool.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .observe(seconds.max(0.0));
    }
}

/// Which surface an answer came through: the `surface` label of `eve_answers_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Surface {
    /// A request with an `Authorization: Bearer` key (the API, the remote CLI, scripts), or no
    /// key at all (`insecure_no_auth`).
    Http,
    /// The page, signed in with its cookie.
    Page,
}

impl Surface {
    /// The surface of a request with these headers: the page sends its cookie and no
    /// `Authorization` header.
    pub(crate) fn of(headers: &axum::http::HeaderMap) -> Self {
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .any(|c| {
                c.trim()
                    .split_once('=')
                    .is_some_and(|(n, _)| n == crate::COOKIE)
            });
        if headers.contains_key(header::AUTHORIZATION) || !cookie {
            Surface::Http
        } else {
            Surface::Page
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Surface::Http => "http",
            Surface::Page => "page",
        }
    }
}

/// Measures the engine's spans; see [`Metrics::layer`].
#[derive(Debug)]
pub struct SpanMetrics {
    metrics: Arc<Metrics>,
}

/// When a span was entered first, kept in its extensions.
struct Started(Instant);

/// The tool and creation time (epoch ms) of an `activation` span's run, kept in its extensions.
struct RunOf {
    tool: String,
    created_at: i64,
}

/// Reads the `tool` and `created_at` fields of an `activation` span, and the `outcome` field
/// of an event.
#[derive(Default)]
struct Fields {
    tool: Option<String>,
    created_at: Option<i64>,
    outcome: Option<String>,
}

impl tracing::field::Visit for Fields {
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        if field.name() == "created_at" {
            self.created_at = Some(value);
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "tool" => self.tool = Some(value.to_owned()),
            "outcome" => self.outcome = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "tool" => self.tool = Some(format!("{value:?}")),
            "outcome" => self.outcome = Some(format!("{value:?}")),
            _ => {}
        }
    }
}

/// Now, in epoch ms on the wall clock.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl<S> tracing_subscriber::Layer<S> for SpanMetrics
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let name = attrs.metadata().name();
        if name != "step" && name != "activation" {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Started(Instant::now()));
            if name == "activation" {
                let mut f = Fields::default();
                attrs.record(&mut f);
                if let (Some(tool), Some(created_at)) = (f.tool, f.created_at) {
                    span.extensions_mut().insert(RunOf { tool, created_at });
                }
            }
            if name == "step" {
                let mut step = StepName(String::new());
                attrs.record(&mut step);
                self.metrics
                    .steps
                    .get_or_create(&vec![("name", step.0)])
                    .inc();
            }
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        // A run's end, logged by the worker inside the run's activation span.
        if !event.metadata().target().starts_with("eve_core")
            || event.metadata().fields().field("outcome").is_none()
        {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        let Some(outcome) = f.outcome else { return };
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if let Some(run) = span.extensions().get::<RunOf>() {
                let seconds = (wall_ms() - run.created_at) as f64 / 1000.0;
                self.metrics.settled(&run.tool, &outcome, seconds);
                return;
            }
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(started) = span.extensions().get::<Started>().map(|s| s.0) else {
            return;
        };
        let secs = started.elapsed().as_secs_f64();
        match span.name() {
            "step" => self.metrics.step_latency.observe(secs),
            "activation" => self.metrics.activation_latency.observe(secs),
            _ => {}
        }
    }
}

/// The `name` field of a `step` span.
struct StepName(String);

impl tracing::field::Visit for StepName {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "name" {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Logs one line per request (method, route pattern, status, latency: never a path with ids or
/// tokens, never a header) and counts it.
pub(crate) async fn access_log(
    State(inner): State<Arc<Inner>>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let resp = next.run(req).await;
    let latency = started.elapsed();
    let status = resp.status().as_u16();
    tracing::info!(target: "eve_server::http", %method, %route, status, latency_ms = latency.as_secs_f64() * 1000.0, "request");
    let m = &inner.metrics;
    m.http
        .get_or_create(&vec![
            ("method", method.to_string()),
            ("route", route.clone()),
            ("status", status.to_string()),
        ])
        .inc();
    m.http_latency
        .get_or_create(&vec![("route", route)])
        .observe(latency.as_secs_f64());
    resp
}

/// Metrics in the Prometheus text format.
///
/// `GET /metrics` (read scope): every metric in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "metrics",
    responses((status = 200, description = "Every metric, in the OpenMetrics text format", content_type = "application/openmetrics-text", body = String)),
    security(("bearer" = ["read"])),
)]
pub(crate) async fn scrape(State(inner): State<Arc<Inner>>) -> Result<Response, crate::ApiError> {
    let m = &inner.metrics;
    let _one = m.scrape.lock().await;
    let mut sessions = BTreeSet::new();
    for status in [
        RunStatus::Running,
        RunStatus::Blocked,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ] {
        let runs = inner
            .store
            .list_runs(&RunQuery {
                status: Some(status),
                ..RunQuery::default()
            })
            .await?;
        m.runs
            .get_or_create(&vec![("status", status.as_str().to_owned())])
            .set(i64::try_from(runs.len()).unwrap_or(i64::MAX));
        if !status.is_terminal() {
            sessions.extend(runs.into_iter().map(|r| r.session_id));
        }
    }
    let mut pending = 0usize;
    for s in &sessions {
        pending += inner
            .store
            .pending_requests(&SessionId::new(s.as_str()))
            .await?
            .len();
    }
    m.pending.set(i64::try_from(pending).unwrap_or(i64::MAX));
    let mut text = String::new();
    encode(&mut text, &m.registry).map_err(|e| {
        crate::ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot encode the metrics: {e}"),
        )
    })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
