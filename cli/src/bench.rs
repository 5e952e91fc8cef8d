//! `eve bench --store URL` / `eve bench --compare URL URL …`: one suite of end-to-end
//! workloads on any backend, each store on fresh storage beside its URL (a temp file next to
//! the SQLite file, a random schema or table, all removed at the end):
//!
//! - **W1**: a 10-step call started and awaited end to end, by 1 and by 8 callers: calls/s,
//!   p50, p99;
//! - **W2**: a 1,000-step call in one process; then a child process (this binary, re-run as
//!   the hidden `eve bench-child`) running the same body is SIGKILLed inside step 1,000, its
//!   journal is replayed cold, and a fresh child with the same worker id takes the run back
//!   and finishes it (from its spawn to its exit);
//! - **throughput**: 64 runs × 50 no-op steps at once, steps/s, and the bytes the store's
//!   storage grew by per step;
//! - **webhook**: 1,000 runs parked on a webhook each, then POSTs at 200/s through eve-server
//!   on loopback, p50 and p99 from just before a POST to the resumed body's next step;
//! - **memory**: the RSS growth per run parked on a 1 h sleep, in a fresh child process per
//!   store (so one store's allocations do not hide another's);
//! - **DynamoDB cost**: read and write capacity units per step (throughput), per call (W1, 1
//!   caller) and per resume (webhook), from `ReturnConsumedCapacity`, and the cost of a
//!   million steps at on-demand prices.
//!
//! With `--compare` the stores are interleaved: each workload runs on every store in turn
//! before the next workload starts, round after round, so they face the same machine load.
//! The figures are medians over the rounds. `--quick` shrinks every size for a smoke test.

#[cfg(feature = "conformance")]
mod probe;
#[cfg(feature = "conformance")]
mod work;

#[cfg(feature = "conformance")]
pub use run_impl::run;
#[cfg(feature = "conformance")]
pub(crate) use work::{child, parked_child};

/// US East (N. Virginia) on-demand price of a million write request units, in USD (AWS's price
/// list since the on-demand price cut of 1 November 2024).
pub const DYNAMODB_WRITE_PRICE: f64 = 0.625;
/// US East (N. Virginia) on-demand price of a million read request units, in USD (same date).
pub const DYNAMODB_READ_PRICE: f64 = 0.125;

/// How much work `eve bench` does. The defaults are the sizes eve is compared on; see
/// [`BenchConfig::quick`] for a smoke test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchConfig {
    /// W1: calls per caller (1 and 8 callers).
    pub calls: u32,
    /// W2: steps of the run that is killed in its last step and recovered.
    pub w2_steps: u32,
    /// Runs started at once for the throughput figure.
    pub runs: u32,
    /// No-op steps of each of those runs.
    pub steps_per_run: u32,
    /// Runs parked on a webhook for the webhook latency figure.
    pub webhook_runs: u32,
    /// Webhook POSTs per second.
    pub webhook_rate: u32,
    /// Runs parked on a sleep for the memory figure.
    pub parked_runs: u32,
    /// Measurement rounds (the figures are medians over them).
    pub rounds: u32,
    /// USD per million DynamoDB write request units.
    pub write_price: f64,
    /// USD per million DynamoDB read request units.
    pub read_price: f64,
    /// Print JSON instead of the table.
    pub json: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            calls: 100,
            w2_steps: 1_000,
            runs: 64,
            steps_per_run: 50,
            webhook_runs: 1_000,
            webhook_rate: 200,
            parked_runs: 5_000,
            rounds: 1,
            write_price: DYNAMODB_WRITE_PRICE,
            read_price: DYNAMODB_READ_PRICE,
            json: false,
        }
    }
}

impl BenchConfig {
    /// Tiny sizes that run every code path in seconds: the CI smoke test's. Its figures mean
    /// nothing.
    pub fn quick() -> Self {
        Self {
            calls: 3,
            w2_steps: 20,
            runs: 4,
            steps_per_run: 5,
            webhook_runs: 5,
            webhook_rate: 100,
            parked_runs: 10,
            ..Self::default()
        }
    }
}

/// One measured figure of one store.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// A stable key (the JSON's), e.g. `w1_1_p50_ms`.
    pub key: &'static str,
    /// What was measured, for the table.
    pub what: &'static str,
    /// The median over the rounds.
    pub value: f64,
}

/// The figures of one store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreFigures {
    /// The URL as given.
    pub url: String,
    /// The backend and, for DynamoDB at an endpoint, `(Local)`.
    pub label: String,
    /// Every figure, in the table's order.
    pub figures: Vec<Figure>,
}

/// Every figure's key and description, in the table's order; the `dynamodb_*` ones only for
/// DynamoDB stores.
pub const FIGURES: &[(&str, &str)] = &[
    ("w1_1_calls_per_s", "W1 10-step call, 1 caller: calls/s"),
    ("w1_1_p50_ms", "W1 1 caller: p50 ms"),
    ("w1_1_p99_ms", "W1 1 caller: p99 ms"),
    ("w1_8_calls_per_s", "W1 8 callers: calls/s"),
    ("w1_8_p50_ms", "W1 8 callers: p50 ms"),
    ("w1_8_p99_ms", "W1 8 callers: p99 ms"),
    ("w2_total_ms", "W2 N-step run, one process: ms"),
    ("w2_replay_ms", "W2 cold replay after SIGKILL: ms"),
    ("w2_replayed_events", "W2 events replayed"),
    ("w2_recover_ms", "W2 fresh process spawn -> done: ms"),
    (
        "w2_recover_inside_ms",
        "W2 recovery inside that process: ms",
    ),
    (
        "throughput_steps_per_s",
        "R x S concurrent no-op steps: steps/s",
    ),
    ("bytes_per_step", "storage bytes per step"),
    ("webhook_p50_ms", "webhook POST -> resumed: p50 ms"),
    ("webhook_p99_ms", "webhook POST -> resumed: p99 ms"),
    ("webhook_errors", "webhook errors (non-202, never resumed)"),
    ("parked_kib_per_run", "worker RSS per parked run: KiB"),
    ("dynamodb_rcu_per_step", "DynamoDB RCU per step"),
    ("dynamodb_wcu_per_step", "DynamoDB WCU per step"),
    ("dynamodb_rcu_per_call", "DynamoDB RCU per 10-step call"),
    ("dynamodb_wcu_per_call", "DynamoDB WCU per 10-step call"),
    ("dynamodb_rcu_per_resume", "DynamoDB RCU per webhook resume"),
    ("dynamodb_wcu_per_resume", "DynamoDB WCU per webhook resume"),
    (
        "dynamodb_usd_per_million_steps",
        "DynamoDB on-demand USD per 1M steps",
    ),
    (
        "dynamodb_unreported_answers",
        "DynamoDB answers without ConsumedCapacity",
    ),
];

#[cfg(feature = "conformance")]
mod run_impl {
    use super::probe::{Probe, Units};
    use super::{work, BenchConfig, Figure, StoreFigures, FIGURES};
    use crate::error::CliError;
    use crate::factory::UrlFactory;
    use crate::store_url::StoreUrl;
    use eve_conformance::StoreFactory;
    use indicatif::{ProgressBar, ProgressStyle};
    use std::collections::BTreeMap;
    use std::io::Write;

    /// One store under measurement.
    struct Subject {
        raw: String,
        url: StoreUrl,
        label: String,
        factory: UrlFactory,
        probe: Option<Probe>,
        samples: BTreeMap<&'static str, Vec<f64>>,
    }

    impl Subject {
        fn record(&mut self, key: &'static str, value: f64) {
            self.samples.entry(key).or_default().push(value);
        }

        fn probe(&self) -> &Probe {
            self.probe.as_ref().expect("opened before the workloads")
        }
    }

    fn label(url: &StoreUrl) -> String {
        match url {
            StoreUrl::Dynamo {
                endpoint: Some(e), ..
            } if !e.contains("amazonaws.com") => "dynamodb (Local)".into(),
            other => other.backend().into(),
        }
    }

    fn bar(len: u64, what: String) -> ProgressBar {
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template("{msg:<44} {bar:30.cyan/blue} {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        bar.set_message(what);
        bar
    }

    fn load() -> String {
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".into())
    }

    /// Runs the suite on fresh storage beside each of `urls` (interleaved, see the module
    /// docs), then prints one table with a column per store (or JSON with `config.json`) on
    /// `out`; progress bars go to stderr. Must run on a multi-thread tokio runtime.
    ///
    /// # Errors
    /// A URL of a backend not compiled in, the backend's error, or a workload that did not
    /// end as it must (a run not completed, a crash that did not happen).
    pub async fn run(
        urls: &[String],
        config: BenchConfig,
        out: &mut dyn Write,
    ) -> Result<Vec<StoreFigures>, CliError> {
        let mut subjects = Vec::new();
        for raw in urls {
            let url: StoreUrl = raw.parse()?;
            url.check_compiled()?;
            let factory = UrlFactory::beside(url.clone())
                .map_err(CliError::store("cannot make a temp dir"))?;
            subjects.push(Subject {
                raw: raw.clone(),
                label: label(&url),
                url,
                factory,
                probe: None,
                samples: BTreeMap::new(),
            });
        }
        let load_start = load();
        let result = measure(&mut subjects, config).await;
        let load_end = load();
        let mut notes = Vec::new();
        for s in &subjects {
            if let Err(e) = s.factory.cleanup().await {
                notes.push(format!(
                    "note: could not remove the bench storage of {}: {e}",
                    s.label
                ));
            }
        }
        result?;
        let stores: Vec<StoreFigures> = subjects
            .iter()
            .map(|s| StoreFigures {
                url: s.raw.clone(),
                label: s.label.clone(),
                figures: FIGURES
                    .iter()
                    .filter_map(|(key, what)| {
                        let mut v = s.samples.get(key)?.clone();
                        v.sort_by(f64::total_cmp);
                        Some(Figure {
                            key,
                            what,
                            value: v[v.len() / 2],
                        })
                    })
                    .collect(),
            })
            .collect();
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        if config.json {
            let json = serde_json::json!({
                "machine": {
                    "cores": cores,
                    "loadavgStart": load_start,
                    "loadavgEnd": load_end,
                },
                "config": {
                    "calls": config.calls, "w2Steps": config.w2_steps, "runs": config.runs,
                    "stepsPerRun": config.steps_per_run, "webhookRuns": config.webhook_runs,
                    "webhookRate": config.webhook_rate, "parkedRuns": config.parked_runs,
                    "rounds": config.rounds,
                    "dynamodbWritePrice": config.write_price,
                    "dynamodbReadPrice": config.read_price,
                },
                "stores": stores.iter().map(|s| serde_json::json!({
                    "url": s.url,
                    "label": s.label,
                    "figures": s.figures.iter()
                        .map(|f| (f.key.to_owned(), serde_json::json!(f.value)))
                        .collect::<serde_json::Map<_, _>>(),
                })).collect::<Vec<_>>(),
            });
            let _ = writeln!(out, "{json:#}");
        } else {
            let _ = writeln!(
                out,
                "eve bench: {} round(s); W1 {} calls/caller, W2 {} steps, {} runs x {} steps, \
                 {} webhook runs at {}/s, {} parked runs; {cores} cores, load {load_start} -> \
                 {load_end}; DynamoDB prices USD {} / {} per million write / read units",
                config.rounds,
                config.calls,
                config.w2_steps,
                config.runs,
                config.steps_per_run,
                config.webhook_runs,
                config.webhook_rate,
                config.parked_runs,
                config.write_price,
                config.read_price,
            );
            write_table(out, &stores);
        }
        for n in notes {
            let _ = writeln!(out, "{n}");
        }
        Ok(stores)
    }

    fn write_table(out: &mut dyn Write, stores: &[StoreFigures]) {
        let _ = write!(out, "{:<44}", "MEASURE");
        for s in stores {
            let _ = write!(out, " {:>18}", s.label);
        }
        let _ = writeln!(out);
        for (key, what) in FIGURES {
            if !stores
                .iter()
                .any(|s| s.figures.iter().any(|f| f.key == *key))
            {
                continue;
            }
            let _ = write!(out, "{what:<44}");
            for s in stores {
                match s.figures.iter().find(|f| f.key == *key) {
                    Some(f) if f.value.abs() >= 100.0 || f.value == f.value.trunc() => {
                        let _ = write!(out, " {:>18.0}", f.value);
                    }
                    Some(f) if f.value.abs() >= 1.0 => {
                        let _ = write!(out, " {:>18.2}", f.value);
                    }
                    Some(f) => {
                        let _ = write!(out, " {:>18.4}", f.value);
                    }
                    None => {
                        let _ = write!(out, " {:>18}", "-");
                    }
                }
            }
            let _ = writeln!(out);
        }
    }

    async fn measure(subjects: &mut [Subject], config: BenchConfig) -> Result<(), CliError> {
        for s in subjects.iter_mut() {
            let opened = s.factory.create().await.map_err(CliError::store(format!(
                "cannot open fresh storage beside {}",
                s.url
            )))?;
            s.probe = Some(Probe::open(&s.url, opened.location, opened.store).await?);
        }
        for round in 1..=config.rounds.max(1) {
            let tag = |s: &Subject, what: &str| format!("[{round}] {} {what}", s.label);
            for callers in [1u32, 8] {
                for s in subjects.iter_mut() {
                    let probe = s.probe().clone();
                    let bar = bar(
                        u64::from(callers * config.calls),
                        tag(s, &format!("W1, {callers} caller(s)")),
                    );
                    let (rate, p50, p99, units) = work::w1(
                        &probe.store,
                        callers as usize,
                        config.calls as usize,
                        || probe.units(),
                        || bar.inc(1),
                    )
                    .await?;
                    bar.finish_and_clear();
                    let calls = f64::from(callers * config.calls);
                    if callers == 1 {
                        s.record("w1_1_calls_per_s", rate);
                        s.record("w1_1_p50_ms", p50);
                        s.record("w1_1_p99_ms", p99);
                        if let Some(u) = units {
                            s.record("dynamodb_rcu_per_call", u.read / calls);
                            s.record("dynamodb_wcu_per_call", u.write / calls);
                        }
                    } else {
                        s.record("w1_8_calls_per_s", rate);
                        s.record("w1_8_p50_ms", p50);
                        s.record("w1_8_p99_ms", p99);
                    }
                }
            }
            for s in subjects.iter_mut() {
                let probe = s.probe().clone();
                let bar = bar(3, tag(s, &format!("W2, {} steps", config.w2_steps)));
                let total = work::w2_total(&probe.store, config.w2_steps).await?;
                bar.inc(1);
                let rec =
                    work::w2_crash(&s.raw, &probe.store, &probe.location, config.w2_steps).await?;
                bar.finish_and_clear();
                s.record("w2_total_ms", total.as_secs_f64() * 1e3);
                s.record("w2_replay_ms", rec.replay.as_secs_f64() * 1e3);
                s.record("w2_replayed_events", rec.events as f64);
                s.record("w2_recover_ms", rec.recover_wall.as_secs_f64() * 1e3);
                s.record(
                    "w2_recover_inside_ms",
                    rec.recover_inside.as_secs_f64() * 1e3,
                );
            }
            for s in subjects.iter_mut() {
                let probe = s.probe().clone();
                let steps = u64::from(config.runs) * u64::from(config.steps_per_run);
                let bar = bar(
                    steps,
                    tag(
                        s,
                        &format!("{} runs x {} steps", config.runs, config.steps_per_run),
                    ),
                );
                let bytes_before = probe.bytes().await?;
                let units_before = probe.units();
                let rate =
                    work::throughput(&probe.store, config.runs, config.steps_per_run, |done| {
                        bar.set_position(done)
                    })
                    .await?;
                let units = probe.units().zip(units_before).map(|(a, b)| a.since(b));
                let bytes_after = probe.bytes().await?;
                bar.finish_and_clear();
                let steps = steps.max(1) as f64;
                s.record("throughput_steps_per_s", rate);
                s.record(
                    "bytes_per_step",
                    bytes_after.saturating_sub(bytes_before) as f64 / steps,
                );
                if let Some(u) = units {
                    s.record("dynamodb_rcu_per_step", u.read / steps);
                    s.record("dynamodb_wcu_per_step", u.write / steps);
                    s.record(
                        "dynamodb_usd_per_million_steps",
                        (u.write / steps) * config.write_price
                            + (u.read / steps) * config.read_price,
                    );
                }
            }
            for s in subjects.iter_mut() {
                let probe = s.probe().clone();
                let bar = bar(
                    u64::from(config.webhook_runs),
                    tag(
                        s,
                        &format!(
                            "webhook, {} runs at {}/s",
                            config.webhook_runs, config.webhook_rate
                        ),
                    ),
                );
                let w = work::webhook(
                    &probe.store,
                    config.webhook_runs as usize,
                    config.webhook_rate as usize,
                    || probe.units(),
                    || bar.inc(1),
                )
                .await?;
                bar.finish_and_clear();
                s.record("webhook_p50_ms", w.p50_ms);
                s.record("webhook_p99_ms", w.p99_ms);
                s.record("webhook_errors", w.errors as f64);
                if let Some(u) = w.units {
                    let n = w.resumed.max(1) as f64;
                    s.record("dynamodb_rcu_per_resume", u.read / n);
                    s.record("dynamodb_wcu_per_resume", u.write / n);
                }
            }
            for s in subjects.iter_mut() {
                let probe = s.probe().clone();
                let bar = bar(1, tag(s, &format!("{} parked runs", config.parked_runs)));
                let kib =
                    work::parked_in_child(&s.raw, &probe.location, config.parked_runs).await?;
                bar.finish_and_clear();
                s.record("parked_kib_per_run", kib);
                if let Some(Units { unreported, .. }) = probe.units() {
                    s.record("dynamodb_unreported_answers", unreported as f64);
                }
            }
        }
        Ok(())
    }
}
