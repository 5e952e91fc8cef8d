//! Retry policy of steps, the context a step closure receives, and duration parsing.

use super::clock::Clock;
use super::error::EngineError;
use super::tool::{tool_call_run, Registry};
use crate::ids::{CallId, RunId, SessionId};
use crate::store::{CreatedRun, Delivered, JournalStore};
use serde::Serialize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a step's failed attempts are retried. "3 retries" means 4 attempts in all. A retry wait
/// is a durable timer (`StepFailed { retry_at }`), not a held task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 3).
    pub max_retries: u32,
    /// Wait before the first retry (default 1 s).
    pub initial_backoff: Duration,
    /// Each further retry waits this many times longer (default 2).
    pub multiplier: u32,
    /// The longest wait (default 1 h).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_secs(1),
            multiplier: 2,
            max_backoff: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// No retries: the first failure is final.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// `max_retries` retries with the default backoff.
    pub fn retries(max_retries: u32) -> Self {
        Self {
            max_retries,
            ..Self::default()
        }
    }

    /// The wait after failed attempt `attempt` (1-based): `initial * multiplier^(attempt-1)`,
    /// capped at `max_backoff`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = self
            .multiplier
            .max(1)
            .saturating_pow(attempt.saturating_sub(1));
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}

/// What the worker running a step lends it: its store, registry and clock, and the run's
/// session. One per activation, shared by its step attempts.
#[derive(Clone, Debug)]
pub(crate) struct StepEnv {
    pub(crate) store: Arc<dyn JournalStore>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) session_id: SessionId,
}

/// What a step closure receives: its identity, stable across retries, replays and workers, and
/// the effects a step may have on other runs ([`StepCtx::start_call`],
/// [`StepCtx::resume_hook`]) without capturing a store: they go to the store of the worker
/// running the step, keyed by the step's identity so a repeated attempt has no second effect.
#[derive(Clone, Debug)]
pub struct StepCtx {
    pub(crate) run_id: RunId,
    pub(crate) cmd: u64,
    pub(crate) name: String,
    pub(crate) attempt: u32,
    pub(crate) fence: crate::FencingToken,
    pub(crate) abort: tokio::sync::watch::Receiver<bool>,
    pub(crate) env: Arc<StepEnv>,
    /// `start_call`s made by this attempt so far (shared by its clones).
    pub(crate) starts: Arc<AtomicU32>,
    /// `resume_hook`s made by this attempt so far (shared by its clones).
    pub(crate) resumes: Arc<AtomicU32>,
    /// The attempt's trace context (its span, in the run's trace).
    pub(crate) trace: crate::trace::TraceContext,
}

impl StepCtx {
    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The step's command counter.
    pub fn cmd(&self) -> u64 {
        self.cmd
    }

    /// Whether the run's cancellation was requested while this attempt runs.
    pub fn is_aborted(&self) -> bool {
        *self.abort.borrow()
    }

    /// Completes once the run's cancellation is requested (the abort signal reached this
    /// attempt); pending forever otherwise. Select on it to stop long work early.
    pub async fn aborted(&self) {
        let mut rx = self.abort.clone();
        if rx.wait_for(|a| *a).await.is_err() {
            // The activation dropped the sender: it is gone and so is this attempt's reason
            // to run; never resolve.
            std::future::pending::<()>().await;
        }
    }

    /// The trace context of this attempt: the run's trace (the caller's, when the call carried
    /// a `traceparent`) and the attempt's own span, the parent of whatever the step calls.
    /// Its id is derived from the run, the step and the attempt, so it is the same in every
    /// process and matches the `step {name}` span the worker reports.
    pub fn trace_context(&self) -> crate::trace::TraceContext {
        self.trace
    }

    /// [`trace_context`](Self::trace_context) as a W3C `traceparent` header value: send it
    /// with the step's outgoing requests so their spans join the run's trace.
    pub fn traceparent(&self) -> String {
        self.trace.to_string()
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// 1-based attempt number.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// `"{run id}:{cmd}"`: the same for every attempt and every replay of this step. Pass it to
    /// the services the step calls so a repeated attempt (steps run at least once) has no
    /// second effect.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.run_id, self.cmd)
    }

    /// The fencing token of the activation running this attempt: larger for every later
    /// activation of the run, whichever worker runs it. The idempotency key makes a repeated
    /// attempt harmless; the token makes a *stale* one refusable. A worker whose lease lapsed
    /// mid-step may start an attempt after the worker that took the run over already ran it
    /// (no time-based lease can exclude that); a service that keeps, per run (or per
    /// idempotency key), the largest token it was shown and refuses smaller ones turns that
    /// late attempt away. Pass [`FencingToken::value`](crate::FencingToken::value) with the
    /// request.
    pub fn fencing_token(&self) -> crate::FencingToken {
        self.fence
    }

    /// The session of the run (where [`start_call`](Self::start_call) starts children).
    pub fn session_id(&self) -> &SessionId {
        &self.env.session_id
    }

    /// The call id of the `n`-th (0-based) [`start_call`](Self::start_call) of an attempt of
    /// this step: `"{run id}:{cmd}:{n}"`, the same for every attempt, replay and worker.
    pub fn child_call_id(&self, n: u32) -> CallId {
        CallId::new(format!("{}:{}:{n}", self.run_id, self.cmd))
    }

    /// The dedupe key of the `n`-th (0-based) [`resume_hook`](Self::resume_hook) of an attempt
    /// of this step: `"{run id}:{cmd}:resume:{n}"`, the same for every attempt.
    pub fn resume_key(&self, n: u32) -> String {
        format!("{}:{}:resume:{n}", self.run_id, self.cmd)
    }

    /// Starts a child call of the tool named `tool` (of the worker's registry and deployment)
    /// in the run's session, with the call id [`child_call_id(n)`](Self::child_call_id) for
    /// the `n`-th start of this attempt. Idempotent per step: a later attempt (after a failure
    /// or a crash before the outcome was recorded) that makes the same starts in the same
    /// order gets the same runs back (`created: false`) and starts no second child. The child
    /// runs on its own (in the background of this run); pass its run id out of the step to
    /// refer to it.
    ///
    /// # Errors
    /// `UnknownTool` or `InvalidInput` (nothing started; fatal as a [`StepError`](super::StepError)); the store's
    /// `IdempotencyMismatch` when an earlier attempt started this child with another input,
    /// `SessionEnded`, or a transient fault (retryable as a [`StepError`](super::StepError)).
    pub async fn start_call<T: Serialize + ?Sized>(
        &self,
        tool: &str,
        input: &T,
    ) -> Result<CreatedRun, EngineError> {
        let input = serde_json::to_value(input).map_err(|e| EngineError::InvalidInput {
            tool: tool.to_owned(),
            reason: format!("the input does not serialize as JSON: {e}"),
        })?;
        let n = self.starts.fetch_add(1, Ordering::SeqCst);
        let call = self.child_call_id(n);
        let mut new = tool_call_run(&self.env.registry, &self.env.session_id, &call, tool, input)?;
        // The child run joins this run's trace, under this attempt's span.
        new.traceparent = Some(self.traceparent());
        Ok(self.env.store.create_run(new, self.env.clock.now()).await?)
    }

    /// Delivers `payload` to the live hook of `token` (any run's, from any worker), deduped by
    /// [`resume_key(n)`](Self::resume_key) for the `n`-th resume of this attempt: a later
    /// attempt that resumes the same hooks in the same order delivers nothing twice (the store
    /// answers `duplicate: true`, also after the hook's run ended).
    ///
    /// # Errors
    /// `NotFound` when no live hook has the token yet (retryable as a [`StepError`](super::StepError): the hook
    /// may be created later); `InvalidInput` when the payload does not serialize; the store's
    /// errors.
    pub async fn resume_hook<T: Serialize + ?Sized>(
        &self,
        token: &str,
        payload: &T,
    ) -> Result<Delivered, EngineError> {
        let n = self.resumes.fetch_add(1, Ordering::SeqCst);
        let key = self.resume_key(n);
        super::tool::resume_hook(
            &*self.env.store,
            token,
            payload,
            Some(&key),
            self.env.clock.now(),
        )
        .await
    }
}

/// Parses a humantime-style duration: a sequence of `<number><unit>` parts, units `ms`, `s`,
/// `m`/`min`, `h`, `d`, `w` (also long forms such as `sec`, `hours`), optionally separated by
/// spaces: `"30s"`, `"4h"`, `"1h 30m"`, `"500ms"`.
///
/// # Errors
/// [`EngineError::InvalidDuration`] saying what was wrong.
pub fn parse_duration(input: &str) -> Result<Duration, EngineError> {
    let bad = |reason: &str| EngineError::InvalidDuration {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad("expected a number"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| bad("number too large"))?;
        rest = rest[digits..].trim_start();
        let ulen = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..ulen];
        let ms: u64 = match unit {
            "ms" | "msec" | "millis" => 1,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
            "d" | "day" | "days" => 86_400_000,
            "w" | "week" | "weeks" => 604_800_000,
            "" => return Err(bad("missing unit after a number")),
            _ => return Err(bad("unknown unit")),
        };
        let part = n.checked_mul(ms).ok_or_else(|| bad("too large"))?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(|| bad("too large"))?;
        rest = &rest[ulen..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_backoff() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("4h").unwrap(), Duration::from_secs(4 * 3600));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        for bad in ["", "h", "10", "10 parsecs", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be rejected");
        }
        let p = RetryPolicy::default();
        assert_eq!(
            (1..=4).map(|a| p.backoff(a).as_secs()).collect::<Vec<_>>(),
            vec![1, 2, 4, 8]
        );
    }
}
