//! One scripted session of every store call, run on `MemoryStore` (the reference) and on
//! `SqliteStore` (a file and the in-memory constructor): every answer must be identical.

use eve_core::{
    Append, AppendId, CallId, DeploymentId, Event, Execution, InputOption, InputRequest,
    InputResponse, JournalStore, JournalStoreExt, Lease, MemoryStore, NewRun, Payload, RequestId,
    Resolution, RunId, RunQuery, RunStatus, SessionId, Timestamp, WorkerId, WorkflowId,
};
use eve_storage_sqlite::SqliteStore;
use std::fmt::Debug;
use std::time::Duration;

const T: i64 = 1_700_000_000_000;
const TTL: Duration = Duration::from_secs(30);

fn at(ms: i64) -> Timestamp {
    Timestamp(T + ms)
}

fn json(s: &str) -> Payload {
    Payload::from_json(s.to_owned()).expect("valid test JSON")
}

fn new_run(id: &str, session: &str, execution: Execution) -> NewRun {
    NewRun {
        run_id: RunId::new(id),
        idempotency_key: None,
        workflow_id: WorkflowId::new("diff::workflow"),
        deployment_id: DeploymentId::new("dep"),
        tool: "tool".into(),
        input: json(r#"{ "x" : 1 }"#),
        session_id: SessionId::new(session),
        call_id: CallId::new(format!("call-{id}")),
        execution,
        traceparent: None,
        reset_from: None,
    }
}

fn append(
    run: &str,
    expected_seq: u64,
    lease: &Lease,
    id: &str,
    events: Vec<Event>,
    now: i64,
) -> Append {
    Append {
        run: RunId::new(run),
        expected_seq,
        lease: lease.clone(),
        append_id: AppendId::new(id),
        events,
        now: at(now),
    }
}

fn request(prompt: &str) -> InputRequest {
    InputRequest {
        prompt: prompt.into(),
        display: Default::default(),
        options: vec![
            InputOption {
                id: "yes".into(),
                label: "Yes".into(),
                description: None,
                style: None,
            },
            InputOption {
                id: "no".into(),
                label: "No".into(),
                description: None,
                style: None,
            },
        ],
        allow_freeform: false,
        agent: None,
        approval: None,
    }
}

/// Records the Debug form of every answer (errors included), in order.
#[derive(Default)]
struct Log(Vec<String>);

impl Log {
    fn note<T: Debug>(&mut self, what: &str, v: T) {
        self.0.push(format!("{what}: {v:?}"));
    }

    fn keep<T: Debug>(&mut self, what: &str, v: T) -> T {
        self.0.push(format!("{what}: {v:?}"));
        v
    }
}

/// Every call of the contract, with the failures MemoryStore gives.
async fn script(s: &dyn JournalStore) -> Vec<String> {
    let mut log = Log::default();
    let a = "run-a";
    let b = "run-b";
    // Starts: new, repeated key, mismatched input, reused id under another key, bad input.
    log.note(
        "create a",
        s.create_run(new_run(a, "s1", Execution::Default), at(0))
            .await,
    );
    log.note(
        "create b",
        s.create_run(new_run(b, "s1", Execution::Background), at(1))
            .await,
    );
    log.note(
        "create a again",
        s.create_run(new_run(a, "s1", Execution::Default), at(2))
            .await,
    );
    let mut other_input = new_run(a, "s1", Execution::Default);
    other_input.input = json("{}");
    log.note(
        "create mismatch",
        s.create_run(other_input, at(3))
            .await
            .map_err(|e| e.to_string()),
    );
    let mut reused_id = new_run(a, "s9", Execution::Default);
    reused_id.call_id = CallId::new("other-call");
    log.note(
        "create reused id",
        s.create_run(reused_id, at(3))
            .await
            .map_err(|e| e.to_string()),
    );
    let mut empty_key = new_run("run-c", "s1", Execution::Default);
    empty_key.idempotency_key = Some(String::new());
    log.note(
        "create empty key",
        s.create_run(empty_key, at(3))
            .await
            .map_err(|e| e.to_string()),
    );

    // Workers and claims.
    let w1 = log
        .keep(
            "register w1",
            s.register_worker(&WorkerId::new("w1"), &DeploymentId::new("dep"), TTL, at(5))
                .await,
        )
        .expect("register");
    log.note(
        "next wake",
        s.next_wake(&DeploymentId::new("dep"), at(5)).await,
    );
    log.note("claim one", s.claim(&w1, 1, at(5)).await);
    log.note("claim rest", s.claim(&w1, 10, at(6)).await);
    log.note("claim none", s.claim(&w1, 10, at(7)).await);
    log.note(
        "next wake held",
        s.next_wake(&DeploymentId::new("dep"), at(7)).await,
    );

    // Appends with effects: a timer, a hook, two asks, progress.
    let (req1, req2) = (RequestId::new("run-a:2"), RequestId::new("run-a:3"));
    let events = vec![
        Event::SleepScheduled {
            cmd: 0,
            wake_at: at(1000),
        },
        Event::HookCreated {
            cmd: 1,
            token: "tok".into(),
            webhook: false,
            respond_with: None,
        },
        Event::InputRequested {
            cmd: 2,
            request_id: req1.clone(),
            request: request("ok?"),
        },
        Event::InputRequested {
            cmd: 3,
            request_id: req2.clone(),
            request: request("sure?"),
        },
        Event::Progress {
            cmd: 4,
            value: json("[1, 2]"),
        },
    ];
    log.note(
        "append a",
        s.append(append(a, 1, &w1, "a1", events.clone(), 10)).await,
    );
    log.note(
        "retry a",
        s.append(append(a, 1, &w1, "a1", events, 11)).await,
    );
    log.note(
        "conflict a",
        s.append(append(
            a,
            1,
            &w1,
            "a2",
            vec![Event::Progress {
                cmd: 5,
                value: json("3"),
            }],
            12,
        ))
        .await
        .map_err(|e| e.to_string()),
    );
    log.note(
        "hook taken",
        s.append(append(
            b,
            1,
            &w1,
            "b1",
            vec![Event::HookCreated {
                cmd: 0,
                token: "tok".into(),
                webhook: true,
                respond_with: None,
            }],
            13,
        ))
        .await
        .map_err(|e| e.to_string()),
    );
    log.note(
        "b progress",
        s.append(append(
            b,
            1,
            &w1,
            "b2",
            vec![
                Event::Progress {
                    cmd: 0,
                    value: json("\"p\""),
                },
                Event::MessagePosted {
                    cmd: 1,
                    message: json("{}"),
                },
            ],
            14,
        ))
        .await,
    );
    log.note(
        "run started refused",
        s.append(append(
            b,
            3,
            &w1,
            "b3",
            vec![new_run("x", "s", Execution::Default).started_event()],
            15,
        ))
        .await
        .map_err(|e| e.to_string()),
    );
    log.note(
        "empty append",
        s.append(append(b, 3, &w1, "b4", vec![], 15))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "unknown run append",
        s.append(append("nope", 0, &w1, "n", vec![Event::RunCancelled], 15))
            .await
            .map_err(|e| e.to_string()),
    );

    // Release, wake-ups by timer and by delivery.
    log.note("release a", s.release(&w1, &RunId::new(a), 6, at(20)).await);
    log.note("release b", s.release(&w1, &RunId::new(b), 3, at(20)).await);
    log.note(
        "release b again",
        s.release(&w1, &RunId::new(b), 3, at(20))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "wake after release",
        s.next_wake(&DeploymentId::new("dep"), at(21)).await,
    );
    log.note("claim before due", s.claim(&w1, 10, at(500)).await);
    log.note(
        "deliver",
        s.deliver_hook("tok", json(r#"{"k": true}"#), Some("d1"), at(600))
            .await,
    );
    log.note(
        "deliver dup",
        s.deliver_hook("tok", json(r#"{"k": false}"#), Some("d1"), at(601))
            .await,
    );
    log.note(
        "deliver no key",
        s.deliver_hook("tok", json("1"), None, at(602)).await,
    );
    log.note(
        "deliver unknown",
        s.deliver_hook("nope", json("1"), None, at(603))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "deliver empty key",
        s.deliver_hook("tok", json("1"), Some(""), at(603))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "wake after delivery",
        s.next_wake(&DeploymentId::new("dep"), at(604)).await,
    );
    log.note("claim delivered", s.claim(&w1, 10, at(605)).await);
    log.note(
        "release partial",
        s.release(&w1, &RunId::new(a), 7, at(606)).await,
    );
    log.note(
        "wake partial",
        s.next_wake(&DeploymentId::new("dep"), at(607)).await,
    );
    log.note("claim partial", s.claim(&w1, 10, at(608)).await);
    log.note(
        "release all",
        s.release(&w1, &RunId::new(a), 100, at(609)).await,
    );
    log.note("claim timer", s.claim(&w1, 10, at(1000)).await);
    log.note(
        "fire",
        s.append(append(
            a,
            8,
            &w1,
            "a3",
            vec![Event::SleepFired { cmd: 0 }],
            1001,
        ))
        .await,
    );
    log.note(
        "release fired",
        s.release(&w1, &RunId::new(a), 9, at(1002)).await,
    );
    log.note(
        "nothing due",
        s.next_wake(&DeploymentId::new("dep"), at(1003)).await,
    );

    // Answers.
    log.note(
        "bad option",
        s.answer(&req1, InputResponse::option("maybe"), at(1100))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "text refused",
        s.answer(&req1, InputResponse::text("hm"), at(1100))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "answer",
        s.answer(&req1, InputResponse::option("yes"), at(1101))
            .await,
    );
    log.note(
        "answer dup",
        s.answer(&req1, InputResponse::option("yes"), at(1102))
            .await,
    );
    log.note(
        "answer other",
        s.answer(&req1, InputResponse::option("no"), at(1103))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "answer unknown",
        s.answer(&RequestId::new("zz"), InputResponse::option("no"), at(1103))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "pending s1",
        s.pending_requests(&SessionId::new("s1")).await,
    );

    // Cancels and blocked runs.
    log.note(
        "cancel b",
        s.request_cancel(&RunId::new(b), "stop", at(1200)).await,
    );
    log.note(
        "cancel b again",
        s.request_cancel(&RunId::new(b), "stop", at(1201)).await,
    );
    log.note(
        "cancel unknown",
        s.request_cancel(&RunId::new("nope"), "stop", at(1201))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "resolve running",
        s.resolve_blocked(&RunId::new(a), Resolution::Resume, at(1202))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note("claim b", s.claim(&w1, 10, at(1203)).await);
    log.note(
        "block b",
        s.append(append(
            b,
            4,
            &w1,
            "b5",
            vec![
                Event::InputRequested {
                    cmd: 2,
                    request_id: RequestId::new("run-b:2"),
                    request: request("b?"),
                },
                Event::RunBlocked {
                    reason: "[X] nondeterminism".into(),
                },
            ],
            1204,
        ))
        .await,
    );
    log.note(
        "resume b",
        s.resolve_blocked(&RunId::new(b), Resolution::Resume, at(1205))
            .await,
    );
    log.note("claim resumed", s.claim(&w1, 10, at(1206)).await);
    log.note(
        "block b again",
        s.append(append(
            b,
            7,
            &w1,
            "b6",
            vec![Event::RunBlocked {
                reason: "again".into(),
            }],
            1207,
        ))
        .await,
    );
    log.note(
        "fail b",
        s.resolve_blocked(
            &RunId::new(b),
            Resolution::Fail {
                error: "operator".into(),
            },
            at(1208),
        )
        .await,
    );
    log.note(
        "cancel ended",
        s.request_cancel(&RunId::new(b), "late", at(1209)).await,
    );

    // Fencing: a new epoch supersedes the old one.
    let w1b = log
        .keep(
            "re-register w1",
            s.register_worker(
                &WorkerId::new("w1"),
                &DeploymentId::new("dep"),
                TTL,
                at(1300),
            )
            .await,
        )
        .expect("register");
    log.note(
        "old epoch heartbeat",
        s.heartbeat(&w1, TTL, at(1301))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "old epoch claim",
        s.claim(&w1, 10, at(1301)).await.map_err(|e| e.to_string()),
    );
    log.note("heartbeat", s.heartbeat(&w1b, TTL, at(1302)).await);
    log.note("claim a by new epoch", s.claim(&w1b, 10, at(1303)).await);
    log.note(
        "old epoch append",
        s.append(append(
            a,
            10,
            &w1,
            "a9",
            vec![Event::Progress {
                cmd: 9,
                value: json("0"),
            }],
            1304,
        ))
        .await
        .map_err(|e| e.to_string()),
    );

    // Ending a run releases hooks, withdraws requests, drops timers.
    log.note(
        "complete a",
        s.append(append(
            a,
            10,
            &w1b,
            "a4",
            vec![
                Event::SleepScheduled {
                    cmd: 5,
                    wake_at: at(9999),
                },
                Event::RunCompleted {
                    output: json(r#"{"done":1}"#),
                },
            ],
            1400,
        ))
        .await,
    );
    log.note(
        "hook released",
        s.deliver_hook("tok", json("1"), None, at(1401))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "withdrawn",
        s.answer(&req2, InputResponse::option("yes"), at(1402))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "append ended",
        s.append(append(a, 12, &w1b, "a5", vec![Event::RunCancelled], 1403))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "no wake",
        s.next_wake(&DeploymentId::new("dep"), at(99_999)).await,
    );
    log.note(
        "hook reusable",
        s.create_run(new_run("run-d", "s2", Execution::Default), at(1500))
            .await,
    );
    log.note("claim d", s.claim(&w1b, 10, at(1501)).await);
    log.note(
        "d takes tok",
        s.append(append(
            "run-d",
            1,
            &w1b,
            "d1",
            vec![Event::HookCreated {
                cmd: 0,
                token: "tok".into(),
                webhook: true,
                respond_with: None,
            }],
            1502,
        ))
        .await,
    );

    // Lease expiry: another worker takes over; the old holder is fenced.
    let w2 = s
        .register_worker(
            &WorkerId::new("w2"),
            &DeploymentId::new("dep"),
            TTL,
            at(1600),
        )
        .await
        .expect("register");
    log.note("w2 lease", &w2);
    log.note(
        "deliver d",
        s.deliver_hook("tok", json("2"), None, at(1601)).await,
    );
    log.note("w2 claim while held", s.claim(&w2, 10, at(1602)).await);
    let later = 1502 + 30_000 + 1;
    let w2 = s
        .heartbeat(&w2, Duration::from_secs(3600), at(later))
        .await
        .expect("heartbeat");
    log.note("w2 claim after expiry", s.claim(&w2, 10, at(later)).await);
    log.note(
        "w1 fenced",
        s.append(append(
            "run-d",
            3,
            &w1b,
            "d2",
            vec![Event::Progress {
                cmd: 1,
                value: json("0"),
            }],
            later,
        ))
        .await
        .map_err(|e| e.to_string()),
    );
    log.note(
        "w1 release fenced",
        s.release(&w1b, &RunId::new("run-d"), 3, at(later))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note("retire w2", s.retire_worker(&w2, at(later + 1)).await);
    log.note(
        "retired heartbeat",
        s.heartbeat(&w2, TTL, at(later + 2))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "unknown heartbeat",
        s.heartbeat(
            &Lease {
                worker: WorkerId::new("ghost"),
                ..w2.clone()
            },
            TTL,
            at(later + 2),
        )
        .await
        .map_err(|e| e.to_string()),
    );
    log.note(
        "wake after retire",
        s.next_wake(&DeploymentId::new("dep"), at(later + 3)).await,
    );

    // Queries and reads.
    for id in [a, b, "run-d"] {
        let run = RunId::new(id);
        log.note("get", s.get_run(&run).await);
        log.note("journal", s.read_all(&run, 0).await);
        log.note("page mid", s.read(&run, 2, 3).await);
        log.note(
            "page end",
            s.read(&run, s.get_run(&run).await.expect("run").next_seq, 10)
                .await,
        );
        log.note(
            "page past end",
            s.read(&run, 99, 10).await.map_err(|e| e.to_string()),
        );
        log.note(
            "page max 0",
            s.read(&run, 0, 0).await.map_err(|e| e.to_string()),
        );
    }
    log.note(
        "get unknown",
        s.get_run(&RunId::new("nope"))
            .await
            .map_err(|e| e.to_string()),
    );
    log.note(
        "read unknown",
        s.read(&RunId::new("nope"), 0, 1)
            .await
            .map_err(|e| e.to_string()),
    );
    log.note("list all", s.list_runs(&RunQuery::default()).await);
    log.note(
        "list s1 limit",
        s.list_runs(&RunQuery {
            session: Some(SessionId::new("s1")),
            limit: 1,
            ..Default::default()
        })
        .await,
    );
    log.note(
        "list failed",
        s.list_runs(&RunQuery {
            status: Some(RunStatus::Failed),
            ..Default::default()
        })
        .await,
    );
    log.note(
        "list dep running",
        s.list_runs(&RunQuery {
            status: Some(RunStatus::Running),
            deployment: Some(DeploymentId::new("dep")),
            ..Default::default()
        })
        .await,
    );
    log.note(
        "pending s1 end",
        s.pending_requests(&SessionId::new("s1")).await,
    );
    log.note(
        "session s1",
        s.read_session(&SessionId::new("s1"), 0, 100).await,
    );
    log.note(
        "session s1 from 2",
        s.read_session(&SessionId::new("s1"), 2, 2).await,
    );
    log.note(
        "session unknown",
        s.read_session(&SessionId::new("zz"), 0, 5).await,
    );
    log.note(
        "session max 0",
        s.read_session(&SessionId::new("s1"), 0, 0)
            .await
            .map_err(|e| e.to_string()),
    );
    log.0
}

fn compare(reference: &[String], got: &[String]) {
    for (i, (r, g)) in reference.iter().zip(got).enumerate() {
        assert_eq!(r, g, "call {i} differs from MemoryStore");
    }
    assert_eq!(reference.len(), got.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_answers_like_memory_store() {
    let reference = script(&MemoryStore::new()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(dir.path().join("j.db"))
        .await
        .expect("open");
    if std::env::var_os("EVE_PRINT_SCRIPT").is_some() {
        println!("{}", reference.join("\n"));
    }
    compare(&reference, &script(&store).await);
    // Everything survives reopening the file.
    drop(store);
    let again = SqliteStore::open(dir.path().join("j.db"))
        .await
        .expect("reopen");
    let run = RunId::new("run-a");
    assert_eq!(
        again.read_all(&run, 0).await.expect("read").len() as u64,
        again.get_run(&run).await.expect("run").next_seq
    );
    assert!(reference
        .iter()
        .any(|l| l.starts_with("journal: Ok([StoredEvent")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_in_memory_answers_like_memory_store() {
    let reference = script(&MemoryStore::new()).await;
    let store = SqliteStore::in_memory().await.expect("in memory");
    compare(&reference, &script(&store).await);
}
