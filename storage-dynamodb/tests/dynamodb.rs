//! DynamoDB-specific behaviour beyond the shared suite: throttling and contention retried then
//! surfaced as `Unavailable` (with injected faults: DynamoDB Local never throttles), the
//! transaction item limit refused cleanly, large bodies chunked in the journal and the session
//! log at once, the DynamoDB calls each operation costs, and orphaned runs (contract clause 5:
//! superseded, retired and expired owners, `next_wake`, claim order, claim cost) through the
//! lapse entries of `gsi4`, and claims and the engine under a lagging index ([`IndexLag`]:
//! DynamoDB Local's indexes never lag).
//!
//! Needs `EVE_TEST_DYNAMODB_ENDPOINT` (see `.ci/dynamodb-local.sh`); without it each test prints
//! that it was skipped and why, and passes.

use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, InputRequest, InputResponse,
    JournalStore, JournalStoreExt, Lease, NewRun, Payload, RequestId, RunId, SessionId, StoreError,
    Timestamp, WorkerId, WorkflowId,
};
use eve_storage_dynamodb::{CallCounts, DynamoConfig, DynamoStore, FaultInjector, IndexLag};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(60);

fn at(ms: i64) -> Timestamp {
    Timestamp(1_700_000_000_000 + ms)
}

fn config(test: &str) -> Option<DynamoConfig> {
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    match std::env::var("EVE_TEST_DYNAMODB_ENDPOINT") {
        Ok(endpoint) => Some(DynamoConfig::local(
            endpoint,
            format!("eve_test_{}", uuid::Uuid::new_v4().simple()),
        )),
        Err(_) => {
            println!(
                "skipped: {test}: EVE_TEST_DYNAMODB_ENDPOINT is unset, so the DynamoDB tests did not run; \
                 start DynamoDB Local with `bash .ci/dynamodb-local.sh` and set \
                 EVE_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:8000"
            );
            None
        }
    }
}

async fn store(cfg: DynamoConfig) -> DynamoStore {
    let s = DynamoStore::connect(cfg).await.expect("connect");
    s.create_table().await.expect("create_table");
    s
}

fn new_run(name: &str, execution: Execution) -> NewRun {
    NewRun {
        run_id: RunId::new(format!("{name}-{}", uuid::Uuid::new_v4().simple())),
        idempotency_key: None,
        workflow_id: WorkflowId::new("tests::wf"),
        deployment_id: DeploymentId::new("d1"),
        tool: "wf".into(),
        input: Payload::from_json(r#"{"n":1}"#).expect("json"),
        session_id: SessionId::new(format!("sess-{name}")),
        call_id: CallId::new(format!("call-{}", uuid::Uuid::new_v4().simple())),
        execution,
        traceparent: None,
        reset_from: None,
    }
}

/// Creates a run and claims it with a fresh worker.
async fn started(s: &DynamoStore, new: NewRun) -> (RunId, Lease) {
    let run = s.create_run(new, at(0)).await.expect("create_run").run;
    let lease = s
        .register_worker(&WorkerId::random(), &DeploymentId::new("d1"), TTL, at(0))
        .await
        .expect("register");
    let claimed = s.claim(&lease, 10, at(1)).await.expect("claim");
    assert!(
        claimed.iter().any(|r| r.run_id == run.run_id),
        "the new run is claimable"
    );
    (run.run_id, lease)
}

fn append(run: &RunId, expected_seq: u64, lease: &Lease, events: Vec<Event>) -> Append {
    Append {
        run: run.clone(),
        expected_seq,
        lease: lease.clone(),
        append_id: AppendId::random(),
        events,
        now: at(2),
    }
}

fn step(cmd: u64) -> Event {
    Event::StepCompleted {
        cmd,
        name: format!("s{cmd}"),
        attempt: 1,
        output: Payload::from_json(format!(r#"{{"cmd":{cmd}}}"#)).expect("json"),
    }
}

#[tokio::test]
async fn throttling_and_contention_are_retried_then_unavailable() {
    let Some(mut cfg) = config("throttling_and_contention_are_retried_then_unavailable") else {
        return;
    };
    let faults = FaultInjector::new();
    cfg.faults = Some(faults.clone());
    cfg.max_attempts = 4;
    cfg.base_backoff = Duration::from_millis(1);
    let s = store(cfg).await;
    let (run, lease) = started(&s, new_run("throttle", Execution::Default)).await;

    // Fewer faults than attempts: the call succeeds after backing off, and every attempt counts.
    for code in [
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "TransactionConflictException",
        "InternalServerError",
    ] {
        let before = (s.call_counts(), faults.injected());
        faults.fail_next(3, code);
        let rec = s
            .get_run(&run)
            .await
            .expect("get_run retried past 3 faults");
        assert_eq!(rec.run_id, run);
        assert_eq!(
            faults.injected() - before.1,
            3,
            "{code}: three faults injected"
        );
        assert_eq!(
            s.call_counts().since(&before.0).total(),
            4,
            "{code}: three failed attempts and one that succeeded"
        );
    }
    let done = s
        .append(append(&run, 1, &lease, vec![step(1)]))
        .await
        .expect("append");
    faults.fail_next(2, "TransactionConflictException");
    let next = s
        .append(append(&run, done.next_seq, &lease, vec![step(2)]))
        .await
        .expect("an append retried past transaction conflicts");
    assert_eq!((next.first_seq, next.duplicate), (2, false));

    // More faults than attempts: a typed, retryable Unavailable, and nothing written.
    faults.fail_next(100, "ProvisionedThroughputExceededException");
    let err = s
        .append(append(&run, 3, &lease, vec![step(3)]))
        .await
        .expect_err("throttled past max_attempts");
    assert!(
        matches!(err, StoreError::Unavailable { .. }) && err.is_retryable(),
        "got {err:?}"
    );
    assert!(
        err.to_string()
            .contains("ProvisionedThroughputExceededException"),
        "{err}"
    );
    faults.fail_next(0, "");
    assert_eq!(
        s.get_run(&run).await.expect("get_run").next_seq,
        3,
        "nothing was written"
    );
}

#[tokio::test]
async fn transaction_item_limit_is_refused_whole() {
    let Some(cfg) = config("transaction_item_limit_is_refused_whole") else {
        return;
    };
    let s = store(cfg).await;
    let (run, lease) = started(&s, new_run("items", Execution::Default)).await;
    // 50 hooks and 50 asks: 100 events (within the contract) but 106 transaction items.
    let mut events = Vec::new();
    for i in 0..50u64 {
        events.push(Event::HookCreated {
            cmd: i,
            token: format!("tok-{run}-{i}"),
            webhook: false,
            respond_with: None,
        });
        events.push(Event::InputRequested {
            cmd: 50 + i,
            request_id: RequestId::for_command(&run, 50 + i),
            request: InputRequest {
                prompt: "?".into(),
                display: Default::default(),
                options: vec![],
                allow_freeform: true,
                agent: None,
                approval: None,
            },
        });
    }
    let err = s
        .append(append(&run, 1, &lease, events.clone()))
        .await
        .expect_err("too many items for one transaction");
    match &err {
        StoreError::LimitExceeded {
            what,
            actual,
            limit,
        } => {
            assert!(what.contains("DynamoDB transaction items"), "{what}");
            assert_eq!((*actual, *limit), (106, 100));
        }
        other => panic!("expected LimitExceeded, got {other:?}"),
    }
    assert_eq!(
        s.get_run(&run).await.expect("get_run").next_seq,
        1,
        "nothing was written"
    );
    assert!(
        matches!(
            s.deliver_hook(&format!("tok-{run}-0"), Payload::null(), None, at(3))
                .await,
            Err(StoreError::NotFound { .. })
        ),
        "no hook of the refused append is live"
    );
    // Split over two appends, the same events land.
    let (a, b) = events.split_at(50);
    let first = s
        .append(append(&run, 1, &lease, a.to_vec()))
        .await
        .expect("first half");
    s.append(append(&run, first.next_seq, &lease, b.to_vec()))
        .await
        .expect("second half");
    assert_eq!(s.read_all(&run, 1).await.expect("read").len(), 100);
}

#[tokio::test]
async fn large_bodies_are_chunked_in_journal_and_session_log() {
    let Some(cfg) = config("large_bodies_are_chunked_in_journal_and_session_log") else {
        return;
    };
    let s = store(cfg).await;
    let new = new_run("big", Execution::Background);
    let session = new.session_id.clone();
    let (run, lease) = started(&s, new).await;
    // Two 1.9 MiB progress values: both the event batch and the session log batch exceed the
    // 400 KB item limit and the transaction's 4 MB, so both are chunked.
    let big = |c: char| {
        let body: String = std::iter::repeat_n(c, 1_900_000).collect();
        Payload::from_json(format!("{{ \"v\" :\t\"{body}\" }}")).expect("json")
    };
    let events = vec![
        Event::Progress {
            cmd: 1,
            value: big('a'),
        },
        Event::Progress {
            cmd: 2,
            value: big('b'),
        },
    ];
    s.append(append(&run, 1, &lease, events.clone()))
        .await
        .expect("a 3.8 MB append");
    let back = s.read(&run, 1, 10).await.expect("read");
    assert_eq!(
        back.iter().map(|e| e.event.clone()).collect::<Vec<_>>(),
        events,
        "payloads come back byte for byte"
    );
    let log = s.read_session(&session, 0, 10).await.expect("read_session");
    assert_eq!(log.len(), 2);
    match &log[1].event {
        eve_core::SessionEvent::TaskProgress { value } => assert_eq!(value.get(), big('b').get()),
        other => panic!("unexpected {other:?}"),
    }
    // A reopened handle (a new client) reads the same.
    let again = DynamoStore::connect(DynamoConfig::local(
        std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").expect("set"),
        s.table(),
    ))
    .await
    .expect("connect");
    assert_eq!(again.read(&run, 1, 10).await.expect("read"), back);
}

fn report(what: &str, calls: &CallCounts, per: u64) {
    println!(
        "dynamodb calls per {what}: {:.4} ({:?} over {per})",
        calls.total() as f64 / per as f64,
        calls.0
    );
}

/// Every request asks for its consumed capacity and the handle adds it up: a steady-state
/// append (one `TransactWriteItems`) reports write units and no read units; a cold handle's
/// append reads the header first (read units). DynamoDB Local answers every one of these with
/// a figure.
#[tokio::test]
async fn consumed_capacity_adds_up_per_handle() {
    let Some(cfg) = config("consumed_capacity_adds_up_per_handle") else {
        return;
    };
    let s = store(cfg).await;
    let (run, lease) = started(&s, new_run("capacity", Execution::Default)).await;
    let before = s.consumed_capacity();
    let mut next = 1;
    for cmd in 1..=10 {
        next = s
            .append(append(&run, next, &lease, vec![step(cmd)]))
            .await
            .expect("append")
            .next_seq;
    }
    let used = s.consumed_capacity().since(&before);
    println!("consumed by 10 appends: {used:?}");
    assert_eq!((used.reported, used.unreported), (10, 0), "{used:?}");
    // A transaction bills each of its items twice, at least one unit each.
    assert!(used.write_units >= 10.0 * 2.0, "{used:?}");
    assert_eq!(used.read_units, 0.0, "{used:?}");

    let cold = DynamoStore::connect(DynamoConfig::local(
        std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").expect("set"),
        s.table(),
    ))
    .await
    .expect("connect");
    assert_eq!(cold.consumed_capacity(), Default::default());
    cold.append(append(&run, next, &lease, vec![step(11)]))
        .await
        .expect("append");
    let c = cold.consumed_capacity();
    assert!(c.read_units > 0.0 && c.write_units > 0.0, "{c:?}");
    assert_eq!(c.unreported, 0, "{c:?}");
    // The first handle saw none of it.
    assert_eq!(s.consumed_capacity().since(&before), used);
}

/// The cost that carries over from DynamoDB Local to AWS: calls per operation. Printed (run with
/// `--nocapture` to see them) and bounded.
#[tokio::test]
async fn calls_per_operation() {
    let Some(cfg) = config("calls_per_operation") else {
        return;
    };
    let s = store(cfg).await;
    let (run, lease) = started(&s, new_run("calls", Execution::Default)).await;

    // A worker's steady-state step commit: one TransactWriteItems (the header is cached).
    let before = s.call_counts();
    let mut next = 1;
    for cmd in 1..=50 {
        next = s
            .append(append(&run, next, &lease, vec![step(cmd)]))
            .await
            .expect("append")
            .next_seq;
    }
    let appends = s.call_counts().since(&before);
    report("append (one step result)", &appends, 50);
    assert_eq!(appends.0.get("TransactWriteItems"), Some(&50));
    assert_eq!(appends.total(), 50, "one call per steady-state append");

    // A step commit from a cold handle pays one header read first.
    let cold = DynamoStore::connect(DynamoConfig::local(
        std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").expect("set"),
        s.table(),
    ))
    .await
    .expect("connect");
    let before = cold.call_counts();
    next = cold
        .append(append(&run, next, &lease, vec![step(51)]))
        .await
        .expect("append")
        .next_seq;
    let c = cold.call_counts().since(&before);
    report("append from a cold handle", &c, 1);
    assert_eq!(c.total(), 2);

    // Deliveries: a keyed hook payload, an answer (with its session log entry), a cancel.
    let token = format!("tok-{run}");
    let request = RequestId::for_command(&run, 53);
    next = s
        .append(append(
            &run,
            next,
            &lease,
            vec![
                Event::HookCreated {
                    cmd: 52,
                    token: token.clone(),
                    webhook: true,
                    respond_with: None,
                },
                Event::InputRequested {
                    cmd: 53,
                    request_id: request.clone(),
                    request: InputRequest {
                        prompt: "ok?".into(),
                        display: Default::default(),
                        options: vec![],
                        allow_freeform: true,
                        agent: None,
                        approval: None,
                    },
                },
            ],
        ))
        .await
        .expect("append")
        .next_seq;
    let before = s.call_counts();
    for i in 0..20 {
        s.deliver_hook(&token, Payload::null(), Some(&format!("k{i}")), at(10 + i))
            .await
            .expect("deliver");
    }
    let hooks = s.call_counts().since(&before);
    report("hook delivery with a dedupe key", &hooks, 20);
    assert_eq!(hooks.total(), 20 * 3, "hook item, header, transaction");
    let before = s.call_counts();
    s.deliver_hook(&token, Payload::null(), Some("k0"), at(40))
        .await
        .expect("duplicate");
    let dup = s.call_counts().since(&before);
    report("duplicate hook delivery", &dup, 1);
    assert_eq!(
        dup.total(),
        4,
        "hook item, header, a failed transaction, dedupe item"
    );
    let before = s.call_counts();
    s.answer(&request, InputResponse::text("yes"), at(41))
        .await
        .expect("answer");
    let ans = s.call_counts().since(&before);
    report("answer", &ans, 1);
    assert_eq!(
        ans.total(),
        4,
        "request item, header, session counter, transaction"
    );

    // Replay: a 2,000-event journal in batches of 4 (500 items) read cold, page by page.
    let new = new_run("replay", Execution::Default);
    let (run2, lease2) = started(&s, new).await;
    let mut next2 = 1;
    for b in 0..500u64 {
        next2 = s
            .append(append(
                &run2,
                next2,
                &lease2,
                (0..4).map(|i| step(b * 4 + i + 1)).collect(),
            ))
            .await
            .expect("append")
            .next_seq;
    }
    let before = cold.call_counts();
    let events = cold.read_all(&run2, 0).await.expect("read_all");
    assert_eq!(events.len() as u64, next2);
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    let replay = cold.call_counts().since(&before);
    report("replayed event", &replay, events.len() as u64);
    assert!(
        replay.total() <= 3,
        "a 2,001-event journal in 501 items reads in at most 3 queries, got {replay:?}"
    );
    let _ = next;
}

/// A transaction whose answer was lost is retried with the same client request token, and
/// DynamoDB answers the retry with success instead of running it again: an append whose first
/// attempt committed is reported once, not as a conflict.
#[tokio::test]
async fn retried_transaction_attempt_is_idempotent() {
    let Some(cfg) = config("retried_transaction_attempt_is_idempotent") else {
        return;
    };
    let s = store(cfg).await;
    let client = DynamoConfig::local(
        std::env::var("EVE_TEST_DYNAMODB_ENDPOINT").expect("set"),
        s.table(),
    )
    .sdk_client();
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    let put = Put::builder()
        .table_name(s.table())
        .item("pk", AttributeValue::S("token-test".into()))
        .item("sk", AttributeValue::S("-".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .expect("put");
    let req = client
        .transact_write_items()
        .client_request_token(uuid::Uuid::new_v4().simple().to_string())
        .transact_items(TransactWriteItem::builder().put(put).build());
    req.clone().send().await.expect("first attempt");
    req.send()
        .await
        .expect("the retry with the same token is answered as success, not a failed condition");
}

// ---- orphaned runs (contract clause 5) ---------------------------------------------------------

fn d1() -> DeploymentId {
    DeploymentId::new("d1")
}

async fn register(s: &DynamoStore, worker: &WorkerId, ttl: Duration, ms: i64) -> Lease {
    s.register_worker(worker, &d1(), ttl, at(ms))
        .await
        .expect("register_worker")
}

async fn claim_ids(s: &DynamoStore, lease: &Lease, max: usize, ms: i64) -> Vec<RunId> {
    s.claim(lease, max, at(ms))
        .await
        .expect("claim")
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

/// Creates a run at `created_ms`, claims it with `lease` at `created_ms + 1` and appends
/// `events` at `append_ms`: the run is held and (without a timer among `events`) has no work.
async fn held_run(
    s: &DynamoStore,
    name: &str,
    lease: &Lease,
    created_ms: i64,
    append_ms: i64,
    events: Vec<Event>,
) -> RunId {
    let run = s
        .create_run(new_run(name, Execution::Default), at(created_ms))
        .await
        .expect("create_run")
        .run
        .run_id;
    assert_eq!(
        claim_ids(s, lease, 1000, created_ms + 1).await,
        vec![run.clone()],
        "the new run is claimed"
    );
    let mut a = append(&run, 1, lease, events);
    a.now = at(append_ms);
    s.append(a).await.expect("append");
    run
}

/// (a) A restarted worker (same id, new epoch) takes back its predecessor's runs at once: no
/// timer, no event, long before the old lease would expire.
#[tokio::test]
async fn superseded_epoch_runs_are_claimable_at_once() {
    let Some(cfg) = config("superseded_epoch_runs_are_claimable_at_once") else {
        return;
    };
    let s = store(cfg).await;
    let id = WorkerId::random();
    let old = register(&s, &id, TTL, 0).await;
    let run = held_run(&s, "superseded", &old, 0, 2, vec![step(1)]).await;
    let other = register(&s, &WorkerId::random(), TTL, 3).await;
    assert!(
        claim_ids(&s, &other, 10, 3).await.is_empty(),
        "held under a valid lease, without work"
    );
    assert_eq!(s.next_wake(&d1(), at(3)).await.expect("next_wake"), None);

    let new = register(&s, &id, TTL, 5).await;
    assert_eq!(new.epoch, old.epoch + 1);
    assert_eq!(
        s.next_wake(&d1(), at(5)).await.expect("next_wake"),
        Some(at(2)),
        "an orphaned run's claim key is its updated_at"
    );
    let got = s.claim(&new, 10, at(6)).await.expect("claim");
    assert_eq!(
        got.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(),
        vec![run.clone()],
        "the new epoch takes the run at once, long before the old lease expires"
    );
    assert_eq!(got[0].owner, Some((id.clone(), new.epoch)));
    assert_eq!(
        got[0].activations, 1,
        "the append reset activations; one claim"
    );
    let mut fork = append(&run, 2, &old, vec![step(2)]);
    fork.now = at(7);
    assert!(matches!(
        s.append(fork).await,
        Err(StoreError::Fenced { .. })
    ));
    let mut a = append(&run, 2, &new, vec![step(2)]);
    a.now = at(7);
    s.append(a)
        .await
        .expect("the new epoch continues the journal");
    assert!(
        claim_ids(&s, &other, 10, 8).await.is_empty(),
        "held by the new epoch"
    );
    assert_eq!(s.next_wake(&d1(), at(8)).await.expect("next_wake"), None);
}

/// (b) A retired worker's runs keep naming it and are claimable at once.
#[tokio::test]
async fn retired_worker_runs_are_claimable_at_once() {
    let Some(cfg) = config("retired_worker_runs_are_claimable_at_once") else {
        return;
    };
    let s = store(cfg).await;
    let w1 = register(&s, &WorkerId::random(), TTL, 0).await;
    let run = held_run(&s, "retired", &w1, 0, 2, vec![step(1)]).await;
    let w2 = register(&s, &WorkerId::random(), TTL, 0).await;
    assert!(claim_ids(&s, &w2, 10, 10).await.is_empty());
    s.retire_worker(&w1, at(20)).await.expect("retire");
    let rec = s.get_run(&run).await.expect("get_run");
    assert_eq!(
        (rec.owner, rec.updated_at),
        (Some((w1.worker.clone(), w1.epoch)), at(2)),
        "retiring leaves the run as it was"
    );
    assert_eq!(
        s.next_wake(&d1(), at(20)).await.expect("next_wake"),
        Some(at(2))
    );
    assert_eq!(claim_ids(&s, &w2, 10, 20).await, vec![run.clone()]);
    assert!(matches!(
        s.retire_worker(&w1, at(21)).await,
        Err(StoreError::Fenced { .. })
    ));
}

/// (c) An expired lease orphans its runs exactly at `expires_at`, not a millisecond before.
#[tokio::test]
async fn expired_lease_runs_are_claimable_from_expiry() {
    let Some(cfg) = config("expired_lease_runs_are_claimable_from_expiry") else {
        return;
    };
    let s = store(cfg).await;
    let w1 = register(&s, &WorkerId::random(), TTL, 0).await;
    let run = held_run(&s, "expired", &w1, 0, 2, vec![step(1)]).await;
    let w2 = register(&s, &WorkerId::random(), TTL * 10, 0).await;
    let expiry = w1.expires_at.millis() - at(0).millis();
    assert!(
        claim_ids(&s, &w2, 10, expiry - 1).await.is_empty(),
        "not claimable while the lease is valid"
    );
    assert_eq!(
        s.next_wake(&d1(), at(expiry - 1)).await.expect("next_wake"),
        None
    );
    assert_eq!(
        s.next_wake(&d1(), at(expiry)).await.expect("next_wake"),
        Some(at(2))
    );
    assert_eq!(claim_ids(&s, &w2, 10, expiry).await, vec![run.clone()]);
    // The lapsed worker renews: the run is w2's now, and its append is fenced.
    let renewed = s
        .heartbeat(&w1, TTL, at(expiry + 1))
        .await
        .expect("heartbeat");
    let mut fork = append(&run, 2, &renewed, vec![step(2)]);
    fork.now = at(expiry + 2);
    assert!(matches!(
        s.append(fork).await,
        Err(StoreError::Fenced { .. })
    ));
}

/// (d) `next_wake` reports an orphaned run's claim key: the earlier of its work and its
/// `updated_at`; held runs are left out.
#[tokio::test]
async fn next_wake_reports_orphaned_runs() {
    let Some(cfg) = config("next_wake_reports_orphaned_runs") else {
        return;
    };
    let s = store(cfg).await;
    let w1 = register(&s, &WorkerId::random(), TTL, 0).await;
    // Held, sleeping until +50 s, last written at +2 ms.
    held_run(
        &s,
        "sleeper",
        &w1,
        0,
        2,
        vec![Event::SleepScheduled {
            cmd: 1,
            wake_at: at(50_000),
        }],
    )
    .await;
    // Not held: released with a timer at +5 s.
    let parked = held_run(
        &s,
        "parked",
        &w1,
        0,
        3,
        vec![Event::SleepScheduled {
            cmd: 1,
            wake_at: at(5_000),
        }],
    )
    .await;
    s.release(&w1, &parked, 2, at(4)).await.expect("release");
    assert_eq!(
        s.next_wake(&d1(), at(10)).await.expect("next_wake"),
        Some(at(5_000)),
        "the held sleeper is left out"
    );
    s.retire_worker(&w1, at(20)).await.expect("retire");
    assert_eq!(
        s.next_wake(&d1(), at(30)).await.expect("next_wake"),
        Some(at(2)),
        "orphaned: min(timer +50 s, updated_at +2 ms)"
    );
}

/// (e) Orphaned runs and runs with due work are claimed in one order, by claim key (an orphaned
/// run's is the earlier of its work and its `updated_at`), ties by creation.
#[tokio::test]
async fn claim_order_follows_claim_keys() {
    let Some(cfg) = config("claim_order_follows_claim_keys") else {
        return;
    };
    let s = store(cfg).await;
    let w1 = register(&s, &WorkerId::random(), TTL, 0).await;
    // Orphan without work, updated at +5.
    let idle = held_run(&s, "orphan-idle", &w1, 0, 5, vec![step(1)]).await;
    // Orphan updated at +6 whose timer came due at +4 (in the wake index and orphaned).
    let timer = held_run(
        &s,
        "orphan-timer",
        &w1,
        0,
        6,
        vec![Event::SleepScheduled {
            cmd: 1,
            wake_at: at(4),
        }],
    )
    .await;
    // Unowned runs whose work (RunStarted) is due at +3, +8 and (a tie with `idle`) +5.
    let mk = |name: &'static str, ms: i64| {
        let s = &s;
        async move {
            s.create_run(new_run(name, Execution::Default), at(ms))
                .await
                .expect("create_run")
                .run
                .run_id
        }
    };
    let early = mk("work-3", 3).await;
    let late = mk("work-8", 8).await;
    let tie = mk("work-5", 5).await;
    s.retire_worker(&w1, at(9)).await.expect("retire");
    let w2 = register(&s, &WorkerId::random(), TTL, 9).await;
    assert_eq!(
        s.next_wake(&d1(), at(10)).await.expect("next_wake"),
        Some(at(3))
    );
    let mut order = Vec::new();
    for _ in 0..6 {
        order.extend(claim_ids(&s, &w2, 1, 10).await);
    }
    assert_eq!(
        order,
        vec![early, timer, idle, tie, late],
        "claim keys 3, 4, 5 (created at 0), 5 (created at 5), 8"
    );
}

/// Claims pay nothing per parked run, and a dead worker's lapse entry costs claims only until
/// its runs are taken and the index has settled.
#[tokio::test]
async fn claim_cost_ignores_parked_runs_and_settled_lapses() {
    let Some(cfg) = config("claim_cost_ignores_parked_runs_and_settled_lapses") else {
        return;
    };
    let s = store(cfg).await;
    let w1 = register(&s, &WorkerId::random(), TTL * 100, 0).await;
    for i in 0..20 {
        let run = held_run(&s, &format!("parked{i}"), &w1, 0, 2, vec![step(1)]).await;
        s.release(&w1, &run, 2, at(3)).await.expect("release");
    }
    let dead = register(&s, &WorkerId::random(), TTL, 0).await;
    let orphan = held_run(&s, "dead", &dead, 0, 2, vec![step(1)]).await;
    let expiry = dead.expires_at.millis() - at(0).millis();
    assert_eq!(claim_ids(&s, &w1, 10, expiry).await, vec![orphan.clone()]);
    s.release(&w1, &orphan, 2, at(expiry + 1))
        .await
        .expect("release");
    // Within the settle margin the dead worker's lapse entry is still read.
    let before = s.call_counts();
    assert!(claim_ids(&s, &w1, 10, expiry + 2).await.is_empty());
    let c = s.call_counts().since(&before);
    report("claim with a recently lapsed worker", &c, 1);
    assert_eq!(
        (c.0.get("GetItem"), c.0.get("Query")),
        (Some(&2), Some(&6)),
        "own and lapsed worker items; 4 wake shards, the lapse entries, the lapsed owner's runs"
    );
    // After it, a claim drops the entry; from then on a claim costs the same as on an empty
    // table, whatever the number of parked runs.
    let settled = expiry + 120_000;
    assert!(claim_ids(&s, &w1, 10, settled).await.is_empty());
    let before = s.call_counts();
    assert!(claim_ids(&s, &w1, 10, settled + 1).await.is_empty());
    let c = s.call_counts().since(&before);
    report("idle claim", &c, 1);
    assert_eq!(
        c,
        CallCounts(
            [("GetItem", 1), ("Query", 5)]
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>()
        ),
        "own worker item; 4 wake shards and the lapse entries"
    );
    // The dead worker comes back: a heartbeat restores its lapse entry, so its next lapse is
    // seen again.
    let back = s
        .heartbeat(&dead, TTL, at(settled + 2))
        .await
        .expect("heartbeat");
    let run = held_run(&s, "back", &back, settled + 3, settled + 5, vec![step(1)]).await;
    let lapse = back.expires_at.millis() - at(0).millis();
    assert!(claim_ids(&s, &w1, 10, lapse - 1).await.is_empty());
    assert_eq!(claim_ids(&s, &w1, 10, lapse).await, vec![run]);
}

/// A claim reads the head of the due queue, not all of it: with 400 runs due, claiming one
/// reads a small part of what claiming all of them reads (on DynamoDB Local: 5 units against
/// 42.5; reading the whole queue, as claims did, costs the one-run claim as much as the other),
/// and still takes the earliest.
#[tokio::test]
async fn claim_reads_the_head_of_the_due_queue() {
    let Some(cfg) = config("claim_reads_the_head_of_the_due_queue") else {
        return;
    };
    let s = store(cfg).await;
    let mut runs = Vec::new();
    for i in 0..400 {
        let new = new_run(&format!("due{i:03}"), Execution::Default);
        runs.push(
            s.create_run(new, at(i))
                .await
                .expect("create_run")
                .run
                .run_id,
        );
    }
    let w = register(&s, &WorkerId::random(), TTL, 0).await;
    let before = s.consumed_capacity();
    assert_eq!(claim_ids(&s, &w, 1, 1_000).await, vec![runs[0].clone()]);
    let one = s.consumed_capacity().since(&before);
    let before = s.consumed_capacity();
    let all = claim_ids(&s, &w, 1_000, 1_000).await;
    let rest = s.consumed_capacity().since(&before);
    println!("claim of 1: {one:?}; claim of the other 399: {rest:?}");
    assert_eq!(all, runs[1..], "the rest, earliest first");
    assert!(
        one.read_units * 4.0 < rest.read_units,
        "a claim of one read {} units, the claim of 399 {}",
        one.read_units,
        rest.read_units
    );
}

#[tokio::test]
async fn store_id_names_endpoint_and_table() {
    let a = DynamoStore::connect(DynamoConfig::local("http://127.0.0.1:8000/", "eve_runs"))
        .await
        .expect("connect");
    let b = DynamoStore::connect(DynamoConfig::local("http://127.0.0.1:8000", "eve_runs"))
        .await
        .expect("connect");
    assert_eq!(a.store_id(), "dynamodb://127.0.0.1:8000/eve_runs");
    assert_eq!(a.store_id(), b.store_id(), "the same in every process");
    let mut aws = DynamoConfig::local("http://x", "t");
    aws.endpoint_url = None;
    aws.region = "eu-west-1".into();
    let c = DynamoStore::connect(aws).await.expect("connect");
    assert_eq!(c.store_id(), "dynamodb://eu-west-1/t");
    let d = DynamoStore::from_client(
        DynamoConfig::local("http://127.0.0.1:8000", "t").sdk_client(),
        "t",
    );
    assert_eq!(d.store_id(), "dynamodb://us-east-1/t");
    assert!(a.wakeups().await.is_none(), "DynamoDB has no notifications");
}

// ---- a lagging wake index (issue 17, item 5) ---------------------------------------------------

/// Under an index that answers each query as it stood one or two queries earlier (what became
/// due since is missed, what was claimed since is still listed), two workers claiming in turn
/// still get every runnable run, some only on a later claim, and never one run twice; a run
/// whose owner's lease expired is found too.
#[tokio::test]
async fn claims_under_a_lagging_index_find_every_run_once() {
    let Some(mut cfg) = config("claims_under_a_lagging_index_find_every_run_once") else {
        return;
    };
    let lag = IndexLag::new(2);
    cfg.index_lag = Some(lag.clone());
    let s = store(cfg).await;
    let a = register(&s, &WorkerId::random(), TTL, 0).await;
    let b = register(&s, &WorkerId::random(), TTL, 0).await;
    // The index is read before the runs exist, so its next answers do not show them.
    assert!(claim_ids(&s, &a, 3, 1).await.is_empty());
    let mut runs = HashSet::new();
    for i in 0..12 {
        let run = s
            .create_run(new_run(&format!("lag{i}"), Execution::Default), at(2))
            .await
            .expect("create_run");
        runs.insert(run.run.run_id);
    }
    assert!(
        claim_ids(&s, &a, 3, 3).await.is_empty(),
        "the first claim after the runs were created misses them: the index lags"
    );
    let mut claimed: HashMap<RunId, &Lease> = HashMap::new();
    for round in 0..60 {
        for lease in [&a, &b] {
            for id in claim_ids(&s, lease, 3, 4 + round).await {
                assert!(
                    claimed.insert(id.clone(), lease).is_none(),
                    "run {id} was claimed twice under a lagging index"
                );
            }
        }
        if claimed.len() == runs.len() {
            break;
        }
    }
    assert_eq!(
        claimed.keys().cloned().collect::<HashSet<_>>(),
        runs,
        "every runnable run is claimed, possibly late"
    );
    assert!(lag.served_stale() > 0, "the index answered stale");

    // a's lease expires: a third worker takes its runs over, late but each once.
    let a_runs: HashSet<RunId> = claimed
        .iter()
        .filter(|(_, l)| l.worker == a.worker)
        .map(|(r, _)| r.clone())
        .collect();
    let after = TTL.as_millis() as i64 + 1_000;
    s.heartbeat(&b, TTL, at(after - 2_000))
        .await
        .expect("b renews its lease");
    let c = register(&s, &WorkerId::random(), TTL, after).await;
    let mut taken = HashSet::new();
    for round in 0..20 {
        for id in claim_ids(&s, &c, 5, after + round).await {
            assert!(taken.insert(id.clone()), "run {id} taken over twice");
            assert!(
                a_runs.contains(&id),
                "only the expired worker's runs are taken over, not b's ({id})"
            );
        }
        if taken.len() == a_runs.len() {
            break;
        }
    }
    assert_eq!(
        taken, a_runs,
        "every run of the expired lease is taken over"
    );
}

/// The engine on a lagging index: two workers race over every program, under crashes too;
/// every run finishes with each step recorded once (the families' checks), whatever the index
/// showed late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_under_a_lagging_index() {
    let Some(mut cfg) = config("engine_under_a_lagging_index") else {
        return;
    };
    let lag = IndexLag::new(2);
    cfg.index_lag = Some(lag.clone());
    let s: std::sync::Arc<dyn JournalStore> = std::sync::Arc::new(store(cfg).await);
    let seed = eve_conformance::engine::seed();
    for family in [
        eve_conformance::engine::Family::RacingWorkers,
        eve_conformance::engine::Family::Crash,
    ] {
        let bench = eve_conformance::engine::driver::Bench::on(s.clone(), "lagging-index");
        let summary = eve_conformance::engine::check_family_on(&bench, family, 12, seed)
            .await
            .unwrap_or_else(|why| panic!("{why}"));
        println!("{summary}");
    }
    assert!(lag.served_stale() > 0, "the index answered stale");
}
