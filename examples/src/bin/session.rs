//! The seed's workflow tools called through a `Session` on a SQLite file: each command starts a
//! session, calls one tool, works it with an in-process worker, prints the session's channel as
//! it arrives, and ends with the call's one result.
//!
//! ```text
//! session deploy   [--service api] [--answer approve|cancel|none] [--answer-after 1s]
//! session deadline [--service api] [--first 3s] [--second 6s] [--answer approve] [--answer-after 4s]
//! session render   [--project s1] [--status ok|failed]      # the webhook version
//! session render-hook [--project s1] [--status ok|failed] [--manual]
//! session render-cleanup [--project s1] [--render-for 1h] [--cancel-after 1s|none]
//! session progress-ask [--answer approve|cancel|none] [--answer-after 1s]
//! session security-review [--service api] [--verdict approve|reject]
//! session refund   [--order o-1] [--amount 25] [--answer approve|deny|none] [--answer-after 1s]
//! session remind   [--note "stretch"] [--delay 3s]
//! session remind-progress [--note "stretch"] [--delay 3s]
//! session answer --session S --request R (--option ID | --text T)     # from another shell
//! ```
//! Every command takes `--db FILE` (default `eve-examples.db`). With `--answer none` (or
//! `--manual` for render) the run waits for you: the command to answer from another shell is
//! printed. Answers go through a second store handle, as another process would; so do the render
//! farm's webhook and hook callbacks. `security-review`'s reviewer subagent is a scripted
//! in-process agent host answering with `--verdict`; `render-cleanup` steers the turn (which
//! cancels the waiting call) after `--cancel-after`, and the cleanup step aborts the job.

use eve_core::engine::{
    parse_duration, resume_hook, EngineError, ScriptedAgentHost, Session, SessionError,
    SystemClock, ToolCallStart, TurnPolicy, Worker, WorkerConfig, WorkerHandle, WEBHOOK_PATH,
};
use eve_core::{
    InputResponse, JournalStore, RequestId, SessionEvent, SessionId, StoreError, Timestamp,
    WebhookRequest,
};
use eve_examples::channel::{describe_entry, follow_until_ended, kind};
use eve_examples::{
    arg, open, registry, render_cleanup, render_hook, render_video, security_review, worker,
};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let s = |name: &str, default: &str| arg(&args, name).unwrap_or_else(|| default.to_owned());
    match args.get(1).map(String::as_str) {
        Some("deploy") => {
            let input = serde_json::json!({ "service": s("--service", "api") });
            run(&args, "deploy", "deploy_approval", input, Some("approve")).await
        }
        Some("deadline") => {
            let input = serde_json::json!({
                "service": s("--service", "api"),
                "first_deadline": s("--first", "3s"),
                "second_deadline": s("--second", "6s"),
            });
            run(&args, "deadline", "deploy_deadline", input, Some("approve")).await
        }
        Some("render") => {
            let input = serde_json::json!({ "project_id": s("--project", "s1") });
            run(&args, "render", "render_video", input, None).await
        }
        Some("render-hook") => {
            let input = serde_json::json!({ "project_id": s("--project", "s1") });
            run(&args, "render-hook", "render_hook", input, None).await
        }
        Some("render-cleanup") => {
            let input = serde_json::json!({
                "project_id": s("--project", "s1"),
                "render_for": s("--render-for", "1h"),
            });
            run(&args, "render-cleanup", "render_cleanup", input, None).await
        }
        Some("progress-ask") => {
            let input = serde_json::json!({});
            run(
                &args,
                "progress-ask",
                "progress_then_ask",
                input,
                Some("approve"),
            )
            .await
        }
        Some("security-review") => {
            let input = serde_json::json!({ "service": s("--service", "api") });
            run(&args, "security-review", "security_review", input, None).await
        }
        Some("refund") => {
            let amount: f64 = s("--amount", "25").parse().expect("--amount is a number");
            let input = serde_json::json!({ "order_id": s("--order", "o-1"), "amount": amount });
            run(&args, "refund", "refund_order", input, Some("approve")).await
        }
        Some("remind") => {
            let input =
                serde_json::json!({ "note": s("--note", "stretch"), "delay": s("--delay", "3s") });
            run(&args, "remind", "remind", input, None).await
        }
        Some("remind-progress") => {
            let input =
                serde_json::json!({ "note": s("--note", "stretch"), "delay": s("--delay", "3s") });
            run(
                &args,
                "remind-progress",
                "remind_with_progress",
                input,
                None,
            )
            .await
        }
        Some("answer") => answer(&args).await,
        _ => {
            eprintln!(
                "use: session deploy|deadline|render|render-hook|render-cleanup|refund|remind|remind-progress|progress-ask|security-review|answer [options] [--db FILE]"
            );
            std::process::exit(2);
        }
    }
}

fn session_on(store: Arc<dyn JournalStore>, id: &str) -> Session {
    Session::new(
        store,
        Arc::new(registry()),
        Arc::new(SystemClock),
        SessionId::new(id),
    )
}

/// Starts a session, calls `tool`, answers its requests as told, and prints the channel until
/// the call's run ends.
async fn run(
    args: &[String],
    example: &str,
    tool: &str,
    input: serde_json::Value,
    default_answer: Option<&str>,
) {
    let db = arg(args, "--db").unwrap_or_else(|| "eve-examples.db".into());
    let store = open(args).await;
    // A second handle on the file: answers and callbacks come "from another process".
    let other = open(args).await;
    let session_id = arg(args, "--session")
        .unwrap_or_else(|| format!("{example}-{}", Timestamp::now().millis()));
    let session = session_on(store.clone(), &session_id);
    let receipt = session
        .call_tool("call-1", tool, input.clone())
        .await
        .unwrap_or_else(|e| panic!("cannot call {tool}: {e}"));
    println!("session {session_id}: the model called {tool} {input}");
    println!(
        "tool call receipt: {}",
        serde_json::to_string(&receipt).expect("receipt serializes")
    );
    if let ToolCallStart::Working { .. } = receipt {
        println!("(background: the turn continues; the task reports on the channel)");
    }
    let run_id = receipt.run_id().clone();
    let w = if tool == "security_review" {
        reviewer_worker(store.clone(), args).await
    } else {
        worker(store.clone(), Duration::from_secs(10)).await
    };
    if tool == "render_video" {
        let status = arg(args, "--status").unwrap_or_else(|| "ok".into());
        let job = format!("job-{}", input["project_id"].as_str().unwrap_or_default());
        tokio::spawn(deliver_render_webhook(other.clone(), job, status));
    }
    if tool == "render_cleanup" {
        let cancel_after = arg(args, "--cancel-after").unwrap_or_else(|| "1s".into());
        if cancel_after != "none" {
            let after =
                parse_duration(&cancel_after).unwrap_or_else(|e| panic!("--cancel-after: {e}"));
            let steerer = session_on(other.clone(), &session_id);
            let project = input["project_id"].as_str().unwrap_or_default().to_owned();
            tokio::spawn(async move {
                // Once the farm renders the job, the user steers: the turn's waiting call is
                // cancelled, and its cleanup step aborts the job within the grace period.
                let job = format!("job-{project}");
                while render_cleanup::farm::state(&job)
                    != Some(render_cleanup::farm::JobState::Rendering)
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(after).await;
                match steerer
                    .user_message(TurnPolicy::Steer, serde_json::json!("stop the render"))
                    .await
                {
                    Ok(outcome) => println!(
                        "(the user steered: {})",
                        serde_json::to_string(&outcome).unwrap_or_default()
                    ),
                    Err(e) => println!("(steer refused: {e})"),
                }
            });
        }
    }

    if tool == "render_hook" {
        let project = input["project_id"].as_str().unwrap_or_default().to_owned();
        let status = arg(args, "--status").unwrap_or_else(|| "ok".into());
        if args.iter().any(|a| a == "--manual") {
            println!(
                "waiting for the render farm; from another shell:\n  cargo run -p eve-examples --bin render -- resume --project {project} --db {db}"
            );
        } else {
            tokio::spawn(deliver_render_callback(other.clone(), project, status));
        }
    }

    let answer_with = arg(args, "--answer").or(default_answer.map(str::to_owned));
    let answer_after = parse_duration(&arg(args, "--answer-after").unwrap_or_else(|| "1s".into()))
        .unwrap_or_else(|e| panic!("--answer-after: {e}"));
    let answerer = session_on(other.clone(), &session_id);
    let answerer = Arc::new(answerer);
    let log = follow_until_ended(&session, &run_id, |entry| {
        println!("{}", describe_entry(entry));
        if let SessionEvent::InputRequested { request_id, .. } = &entry.event {
            match answer_with.as_deref() {
                Some(option) if option != "none" => {
                    let answerer = answerer.clone();
                    let request = request_id.clone();
                    let option = option.to_owned();
                    tokio::spawn(async move {
                        tokio::time::sleep(answer_after).await;
                        match answerer
                            .answer(&request, InputResponse::option(&option))
                            .await
                        {
                            Ok(_) => println!("(a person answered {option:?} to {request})"),
                            Err(e) => println!("(answer to {request} refused: {e})"),
                        }
                    });
                }
                _ => println!(
                    "answer from another shell:\n  cargo run -p eve-examples --bin session -- answer --db {db} --session {session_id} --request {request_id} --option approve"
                ),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("following the channel failed: {e}"));
    w.shutdown().await;
    if tool == "render_cleanup" {
        let job = format!("job-{}", input["project_id"].as_str().unwrap_or_default());
        println!(
            "(render farm: job {job} is {:?})",
            render_cleanup::farm::state(&job)
        );
    }
    let kinds: Vec<String> = log
        .iter()
        .filter(|e| e.run_id == run_id)
        .map(|e| kind(&e.event))
        .collect();
    println!("channel events: {kinds:?}");
    let last = log.last().expect("the ending entry");
    let result = match &last.event {
        SessionEvent::ToolSettled { result } => serde_json::to_string(result),
        SessionEvent::TaskCompleted { output } => Ok(output.get().to_owned()),
        other => serde_json::to_string(other),
    }
    .expect("result serializes");
    println!("result: {result}");
}

/// Delivers the render farm's callback once the run's hook is live (as another process
/// would, retrying until the token exists).
async fn deliver_render_callback(store: Arc<dyn JournalStore>, project: String, status: String) {
    let callback = render_hook::Callback {
        status,
        url: Some(format!("https://cdn.example/{project}.mp4")),
    };
    loop {
        match resume_hook(
            &*store,
            &render_hook::token(&project),
            &callback,
            Some("farm-delivery-1"),
            Timestamp::now(),
        )
        .await
        {
            Ok(_) => {
                println!("(the render farm called back: {callback:?})");
                return;
            }
            Err(EngineError::Store(StoreError::NotFound { .. })) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => {
                println!("(callback refused: {e})");
                return;
            }
        }
    }
}

/// A worker whose registry has an agent host: the `reviewer` subagent, scripted to answer
/// with `--verdict` (approve or reject) at once, as a host's model would.
async fn reviewer_worker(store: Arc<dyn JournalStore>, args: &[String]) -> WorkerHandle {
    let approve = arg(args, "--verdict").as_deref() != Some("reject");
    let host = ScriptedAgentHost::new(store.clone()).reply(security_review::TARGET, move |start| {
        println!(
            "(subagent {} asked: {})",
            start.target,
            start.message.as_str().unwrap_or_default()
        );
        Ok(if approve {
            serde_json::json!({ "approved": true, "findings": ["no secrets or open ports in the plan"] })
        } else {
            serde_json::json!({ "approved": false, "findings": ["the plan opens port 22 to the internet"] })
        })
    });
    let config = WorkerConfig {
        lease_ttl: Duration::from_secs(10),
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    Worker::new(
        store,
        registry().with_agent_host(Arc::new(host)),
        Arc::new(SystemClock),
        config,
    )
    .await
    .expect("register worker")
    .spawn()
}

/// The render farm of `render_video`: once the run's `submit_render` step has handed it the
/// webhook URL, it calls back with `{status, url}` — delivered as the `WebhookRequest` that
/// `eve serve` makes of a POST to that URL — from a second store handle.
async fn deliver_render_webhook(store: Arc<dyn JournalStore>, job_id: String, status: String) {
    let callback_url = loop {
        match render_video::farm::callback_url(&job_id) {
            Some(url) => break url,
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let token = callback_url
        .rsplit_once(WEBHOOK_PATH)
        .map(|(_, t)| t.to_owned())
        .expect("the callback URL is a webhook URL");
    let body = serde_json::json!({
        "status": status,
        "url": format!("https://cdn.example/{job_id}.mp4"),
    });
    println!("(the render farm POSTs {body} to the webhook)");
    let request = WebhookRequest {
        method: "POST".into(),
        headers: [("content-type".to_owned(), "application/json".to_owned())].into(),
        body,
    };
    if let Err(e) = resume_hook(
        &*store,
        &token,
        &request,
        Some("farm-delivery-1"),
        Timestamp::now(),
    )
    .await
    {
        println!("(callback refused: {e})");
    }
}

async fn answer(args: &[String]) {
    let store = open(args).await;
    let session_id = arg(args, "--session").expect("--session ID");
    let request = RequestId::new(arg(args, "--request").expect("--request ID"));
    let response = match (arg(args, "--option"), arg(args, "--text")) {
        (Some(o), _) => InputResponse::option(o),
        (None, Some(t)) => InputResponse::text(t),
        (None, None) => {
            eprintln!("give --option ID or --text TEXT");
            std::process::exit(2);
        }
    };
    match session_on(store, &session_id)
        .answer(&request, response)
        .await
    {
        Ok(d) => println!("answered request {request} (run {}, seq {})", d.run, d.seq),
        Err(
            e @ (SessionError::AlreadyAnswered { .. }
            | SessionError::Withdrawn { .. }
            | SessionError::InvalidAnswer { .. }
            | SessionError::UnknownRequest { .. }),
        ) => {
            eprintln!("cannot answer: {e}");
            std::process::exit(1);
        }
        Err(e) => panic!("store error: {e}"),
    }
}
