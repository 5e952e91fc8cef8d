//! `eve journal` masks webhook tokens unless `--reveal`, in the readable form and in the JSON
//! export, and `eve replay` passes on a masked export.

use eve_cli::{inspect, replay};
use eve_core::engine::{
    define_workflow_tool, start_tool_call, ManualClock, Registry, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError,
};
use eve_core::{
    workflow, CallId, Event, JournalStore, JournalStoreExt, MemoryStore, Payload, RunStatus,
    SessionId, Timestamp, WebhookRequest,
};
use std::sync::Arc;

/// Mints a webhook and returns its one delivery, with the length of the webhook's path (the
/// body works with the token it reads back from a masked journal too).
async fn one_webhook(
    ctx: WorkflowCtx,
    _input: serde_json::Value,
) -> Result<serde_json::Value, WorkflowError> {
    let hook = ctx.create_webhook::<WebhookRequest>();
    let path = hook.path();
    let delivery = hook.next().await?;
    Ok(serde_json::json!({ "body": delivery.body, "announced": !path.is_empty() }))
}

fn registry() -> Registry {
    Registry::new("cli-journal-tests")
        .with(define_workflow_tool("One webhook.", workflow!(one_webhook)).named("one_webhook"))
}

async fn journal(store: &Arc<dyn JournalStore>, run: &str, json: bool, reveal: bool) -> String {
    let mut out = Vec::new();
    let target = eve_cli::target::Target::Local(store.clone());
    inspect::journal(&target, run, json, reveal, &mut out)
        .await
        .expect("eve journal");
    String::from_utf8(out).expect("UTF-8")
}

#[tokio::test]
async fn journal_masks_webhook_tokens_and_replay_passes_on_a_masked_export() {
    let store: Arc<dyn JournalStore> = Arc::new(MemoryStore::new());
    let clock = ManualClock::new(Timestamp(1_000));
    let worker = Worker::new(
        store.clone(),
        registry(),
        clock.clone(),
        WorkerConfig::default(),
    )
    .await
    .unwrap();
    let run = start_tool_call(
        &*store,
        &registry(),
        &SessionId::new("s1"),
        &CallId::new("c1"),
        "one_webhook",
        serde_json::json!({}),
        Timestamp(1_000),
    )
    .await
    .unwrap()
    .run
    .run_id;
    worker.drain().await.unwrap();
    let token = store
        .read_all(&run, 0)
        .await
        .unwrap()
        .into_iter()
        .find_map(|e| match e.event {
            Event::HookCreated {
                token,
                webhook: true,
                ..
            } => Some(token),
            _ => None,
        })
        .expect("the webhook was created");
    let request = serde_json::json!({ "method": "POST", "headers": {}, "body": { "ok": true } });
    store
        .deliver_hook(
            &token,
            Payload::from_value(&request).unwrap(),
            None,
            Timestamp(1_000),
        )
        .await
        .unwrap();
    worker.drain().await.unwrap();
    assert_eq!(
        store.get_run(&run).await.unwrap().status,
        RunStatus::Completed
    );

    // Masked by default, readable and JSON; whole with --reveal.
    let masked = format!("{}…", &token[..eve_core::MASKED_TOKEN_CHARS]);
    for json in [false, true] {
        let shown = journal(&store, run.as_str(), json, false).await;
        assert!(!shown.contains(&token), "json {json}: {shown}");
        assert!(shown.contains(&masked), "json {json}: {shown}");
        let revealed = journal(&store, run.as_str(), json, true).await;
        assert!(revealed.contains(&token), "json {json}: {revealed}");
    }
    // A masked export replays cleanly.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{run}.jsonl"));
    std::fs::write(&file, journal(&store, run.as_str(), true, false).await).unwrap();
    let mut out = Vec::new();
    replay::run(&[file], &registry(), &mut out).expect("a masked export replays");
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("replays cleanly"), "{out}");
    assert!(out.contains("the body returns"), "{out}");
}
