//! DynamoDB-specific behaviour beyond the shared suite: throttling and contention retried then
//! surfaced as `Unavailable` (with injected faults: DynamoDB Local never throttles), the
//! transaction item limit refused cleanly, large bodies chunked in the journal and the session
//! log at once, and the DynamoDB calls each operation costs.
//!
//! Needs `EVE_TEST_DYNAMODB_ENDPOINT` (see `.ci/dynamodb-local.sh`); without it each test prints
//! that it was skipped and why, and passes.

use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, InputRequest, InputResponse,
    JournalStore, JournalStoreExt, Lease, NewRun, Payload, RequestId, RunId, SessionId, StoreError,
    Timestamp, WorkerId, WorkflowId,
};
use eve_storage_dynamodb::{CallCounts, DynamoConfig, DynamoStore, FaultInjector};
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
