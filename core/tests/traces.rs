#![allow(unreachable_pub)]
//! Traces: the spans a run reports to a [`TraceSink`] form one tree under the run's root span,
//! joined to the caller's `traceparent`; a run resumed by another worker (a restarted process)
//! replays its journal without reporting any span twice; a malformed `traceparent` starts a
//! trace of the run's own.

mod common;

use common::Env;
use eve_core::engine::Clock as _;
use eve_core::engine::{
    tool_call_run, ActivationEnd, Registry, RetryPolicy, StepError, WorkflowCtx, WorkflowError,
    WorkflowTool,
};
use eve_core::trace::{AttrValue, CollectingSink, Span, SpanId, TraceContext};
use eve_core::{
    workflow, CallId, Event, InputRequest, InputResponse, JournalStoreExt, RunId, SessionId,
    Timestamp,
};
use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

mod deploy {
    use super::*;

    #[derive(Deserialize, JsonSchema)]
    pub struct Input {
        pub service: String,
    }

    /// Two steps, one failing once, an ask, and a last step.
    pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<String, WorkflowError> {
        let service = input.service;
        let tp: String = ctx
            .step("build", |s| async move { Ok(s.traceparent()) })
            .await?;
        ctx.step("push", |s| async move {
            if s.attempt() == 1 {
                return Err(StepError::retryable("registry busy"));
            }
            Ok(())
        })
        .retry(RetryPolicy::retries(2))
        .await?;
        let answer = ctx
            .ask(InputRequest::confirmation(format!("Deploy {service}?")))
            .await;
        ctx.step("release", |_| async move { Ok(()) }).await?;
        Ok(format!("{tp} {}", answer.option_id.unwrap_or_default()))
    }

    pub fn tool() -> WorkflowTool {
        eve_core::engine::define_workflow_tool("Deploy a service.", workflow!(execute))
            .named("deploy")
    }
}

async fn start(env: &Env, reg: &Registry, call: &str, traceparent: Option<&str>) -> RunId {
    let mut new = tool_call_run(
        reg,
        &SessionId::new("s"),
        &CallId::new(call),
        "deploy",
        serde_json::json!({"service": "api"}),
    )
    .unwrap();
    new.traceparent = traceparent.map(str::to_owned);
    env.store
        .create_run(new, env.clock.now())
        .await
        .unwrap()
        .run
        .run_id
}

async fn at_of(env: &Env, run: &RunId, pick: impl Fn(&Event) -> bool) -> Timestamp {
    env.store
        .read_all(run, 0)
        .await
        .unwrap()
        .into_iter()
        .find(|e| pick(&e.event))
        .expect("event in the journal")
        .at
}

fn attr<'a>(s: &'a Span, k: &str) -> &'a AttrValue {
    s.attr(k)
        .unwrap_or_else(|| panic!("{} has no {k}: {s:?}", s.name))
}

#[tokio::test]
async fn one_tree_across_a_restart_none_twice() {
    let env = common::sqlite().await;
    let reg = Registry::new("v1").with(deploy::tool());
    let run = start(&env, &reg, "c1", Some(CALLER)).await;

    // The first process: the steps, a retry after its backoff, then the ask suspends the run.
    let first = CollectingSink::new();
    let w1 = env.worker(&reg).await;
    assert!(w1.trace_to(Arc::new(first.clone())));
    assert_eq!(w1.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    env.clock.advance(Duration::from_secs(1));
    assert_eq!(w1.drain().await.unwrap()[0].1, ActivationEnd::Suspended);
    drop(w1);

    // Days later, another process (a restarted server) takes the answer and resumes the run
    // by replaying its journal.
    env.clock.advance(Duration::from_secs(2 * 86_400));
    let request = env
        .events(&run)
        .await
        .into_iter()
        .find_map(|e| match e {
            Event::InputRequested { request_id, .. } => Some(request_id),
            _ => None,
        })
        .unwrap();
    env.store
        .answer(
            &request,
            InputResponse::option("approve").by("alice"),
            env.clock.now(),
        )
        .await
        .unwrap();
    let second = CollectingSink::new();
    let w2 = env.worker(&reg).await;
    assert!(w2.trace_to(Arc::new(second.clone())));
    assert_eq!(w2.drain().await.unwrap()[0].1, ActivationEnd::Completed);

    let a = first.spans();
    let b = second.spans();
    // The second process reported nothing the first had: replay continues, never repeats.
    let ids_a: HashSet<SpanId> = a.iter().map(|s| s.span_id).collect();
    assert!(
        b.iter().all(|s| !ids_a.contains(&s.span_id)),
        "a span reported twice after the restart: {:#?}",
        b.iter()
            .filter(|s| ids_a.contains(&s.span_id))
            .collect::<Vec<_>>()
    );
    let spans: Vec<Span> = a.into_iter().chain(b).collect();
    let ids: HashSet<SpanId> = spans.iter().map(|s| s.span_id).collect();
    assert_eq!(ids.len(), spans.len(), "duplicate span ids: {spans:#?}");
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();

    // One trace: the caller's, and the root is the child of the caller's span.
    let caller = TraceContext::parse(CALLER).unwrap();
    assert!(spans.iter().all(|s| s.trace_id == caller.trace_id));
    let root = spans
        .iter()
        .find(|s| s.name == "execute_tool deploy")
        .unwrap_or_else(|| panic!("no root span in {names:?}"));
    assert_eq!(root.parent_span_id, Some(caller.span_id));
    assert_eq!(attr(root, "gen_ai.tool.name"), &AttrValue::from("deploy"));
    assert_eq!(attr(root, "eve.run.outcome"), &AttrValue::from("completed"));
    for s in spans.iter().filter(|s| s.span_id != root.span_id) {
        assert_eq!(
            s.parent_span_id,
            Some(root.span_id),
            "{} not under the root",
            s.name
        );
        assert!(
            s.start >= root.start && s.end <= root.end,
            "{s:?} outside {root:?}"
        );
    }
    assert_eq!(
        root.start,
        at_of(&env, &run, |e| matches!(e, Event::RunStarted { .. })).await
    );
    assert_eq!(root.end, at_of(&env, &run, Event::is_terminal).await);

    // Step attempts: the retried one twice, with its outcome and delay.
    let steps: Vec<(String, i64, String)> = spans
        .iter()
        .filter(|s| s.name.starts_with("step "))
        .map(|s| {
            let AttrValue::Int(n) = attr(s, "eve.step.attempt") else {
                panic!()
            };
            let AttrValue::Str(o) = attr(s, "eve.step.outcome") else {
                panic!()
            };
            (s.name.clone(), *n, o.clone())
        })
        .collect();
    let step = |n: &str, a: i64, o: &str| (n.to_owned(), a, o.to_owned());
    assert_eq!(
        steps,
        [
            step("step build", 1, "ok"),
            step("step push", 1, "retry"),
            step("step push", 2, "ok"),
            step("step release", 1, "ok"),
        ]
    );
    let failed = spans
        .iter()
        .find(|s| s.name == "step push" && s.attr("eve.step.retry_delay_ms").is_some())
        .unwrap();
    assert_eq!(
        attr(failed, "eve.step.retry_delay_ms"),
        &AttrValue::Int(1000)
    );
    let retried = spans
        .iter()
        .find(|s| s.name == "step push" && s.attr("eve.step.attempt") == Some(&AttrValue::Int(2)))
        .unwrap();
    assert_eq!(retried.start, failed.end.plus(Duration::from_secs(1)));

    // The ask: from its request (first process) to its answer two days later (second).
    let ask = spans.iter().find(|s| s.name == "ask").unwrap();
    assert_eq!(
        ask.start,
        at_of(&env, &run, |e| matches!(e, Event::InputRequested { .. })).await
    );
    assert_eq!(
        ask.end,
        at_of(&env, &run, |e| matches!(e, Event::InputAnswered { .. })).await
    );
    assert!(ask.end.millis() - ask.start.millis() >= 2 * 86_400_000);
    assert_eq!(attr(ask, "eve.answered_by"), &AttrValue::from("alice"));
    assert!(
        second.spans().iter().any(|s| s.name == "ask"),
        "the answering side reports it"
    );

    // Three activations, each reported by the process that ran it.
    assert_eq!(names.iter().filter(|n| **n == "activation").count(), 3);

    // The step's outgoing traceparent is its attempt span, in the caller's trace.
    let out = env.output(&run).await;
    let tp = out.as_str().unwrap().split(' ').next().unwrap();
    let build = spans.iter().find(|s| s.name == "step build").unwrap();
    let ctx = TraceContext::parse(tp).unwrap();
    assert_eq!(
        (ctx.trace_id, ctx.span_id),
        (caller.trace_id, build.span_id)
    );
}

#[tokio::test]
async fn malformed_traceparent_starts_a_new_trace() {
    let env = common::memory().await;
    let reg = Registry::new("v1").with(deploy::tool());
    let sink = CollectingSink::new();
    let w = env.worker(&reg).await;
    w.trace_to(Arc::new(sink.clone()));
    let bad = start(&env, &reg, "bad", Some("00-not-a-traceparent-01")).await;
    let none = start(&env, &reg, "none", None).await;
    w.drain().await.unwrap();
    env.clock.advance(Duration::from_secs(1));
    w.drain().await.unwrap();
    for run in [&bad, &none] {
        let request = eve_core::RequestId::for_command(run, 2);
        env.store
            .answer(&request, InputResponse::option("approve"), env.clock.now())
            .await
            .unwrap();
    }
    w.drain().await.unwrap();
    let spans = sink.spans();
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "execute_tool deploy")
        .collect();
    assert_eq!(roots.len(), 2, "both runs ran and ended: {spans:#?}");
    let caller = TraceContext::parse(CALLER).unwrap();
    for r in &roots {
        assert_eq!(r.parent_span_id, None, "a new trace, not a child");
        assert_ne!(r.trace_id, caller.trace_id);
    }
    assert_ne!(roots[0].trace_id, roots[1].trace_id, "a trace per run");
    assert!(env.output(&bad).await.is_string());
}
