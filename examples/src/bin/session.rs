//! The seed's workflow tools called through a `Session` on a SQLite file: each command starts a
//! session, calls one tool, works it with an in-process worker, prints the session's channel as
//! it arrives, and ends with the call's one result.
//!
//! ```text
//! session deploy   [--service api] [--answer approve|cancel|none] [--answer-after 1s]
//! session deadline [--service api] [--first 3s] [--second 6s] [--answer approve] [--answer-after 4s]
//! session render   [--project s1] [--status ok|failed] [--manual]
//! session refund   [--order o-1] [--amount 25] [--answer approve|deny|none] [--answer-after 1s]
//! session remind   [--note "stretch"] [--delay 3s]
//! session remind-progress [--note "stretch"] [--delay 3s]
//! session answer --session S --request R (--option ID | --text T)     # from another shell
//! ```
//! Every command takes `--db FILE` (default `eve-examples.db`). With `--answer none` (or
//! `--manual` for render) the run waits for you: the command to answer from another shell is
//! printed. Answers go through a second store handle, as another process would.

use eve_core::engine::{
    parse_duration, resume_hook, EngineError, Session, SessionError, SystemClock, ToolCallStart,
};
use eve_core::{
    InputResponse, JournalStore, RequestId, SessionEvent, SessionId, StoreError, Timestamp,
};
use eve_examples::channel::{describe_entry, follow_until_ended, kind};
use eve_examples::{arg, open, registry, render_video, worker};
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
                "use: session deploy|deadline|render|refund|remind|remind-progress|answer [options] [--db FILE]"
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
    let w = worker(store.clone(), Duration::from_secs(10)).await;

    if tool == "render_video" {
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
    let callback = render_video::Callback {
        status,
        url: Some(format!("https://cdn.example/{project}.mp4")),
    };
    loop {
        match resume_hook(
            &*store,
            &render_video::token(&project),
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
