//! Approve with a deadline and an escalation.
//!
//! ```text
//! escalation start --service api [--first 10s] [--second 20s] [--db FILE]
//! escalation approve --service api [--reject] [--db FILE]     # from another shell
//! ```
//! Leave it unanswered past `--first` to see on-call paged; past `--second` it times out.

use eve_core::engine::{resume_hook, start_tool_call};
use eve_core::{CallId, SessionId, Timestamp};
use eve_examples::deploy::{token, Answer};
use eve_examples::{arg, follow, open, worker};
use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let service = arg(&args, "--service").unwrap_or_else(|| "api".into());
    let store = open(&args).await;
    match args.get(1).map(String::as_str) {
        Some("start") => {
            let first = arg(&args, "--first").unwrap_or_else(|| "10s".into());
            let second = arg(&args, "--second").unwrap_or_else(|| "20s".into());
            let created = start_tool_call(
                &*store,
                &eve_examples::registry(),
                &SessionId::new("examples"),
                &CallId::new(format!("deploy-{service}")),
                "deploy",
                serde_json::json!({
                    "service": service,
                    "first_deadline": first,
                    "second_deadline": second,
                }),
                Timestamp::now(),
            )
            .await
            .unwrap_or_else(|e| panic!("cannot start the run: {e}"));
            let run = created.run.run_id;
            println!(
                "run {run}: deploy {service} awaits approval (page after {first}, give up {second} later). From another shell:\n  cargo run -p eve-examples --bin escalation -- approve --service {service}"
            );
            let w = worker(store.clone(), Duration::from_secs(10)).await;
            let status = follow(&*store, &run, "").await;
            w.shutdown().await;
            println!("run {run} ended {}", status.as_str());
        }
        Some("approve") => {
            let answer = Answer {
                option_id: if args.iter().any(|a| a == "--reject") {
                    "cancel".into()
                } else {
                    "approve".into()
                },
            };
            match resume_hook(&*store, &token(&service), &answer, None, Timestamp::now()).await {
                Ok(d) => println!("answered {answer:?} to run {} at seq {}", d.run, d.seq),
                Err(e) => {
                    eprintln!("cannot answer: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => {
            eprintln!("use: escalation start|approve --service NAME [--db FILE]");
            std::process::exit(2);
        }
    }
}
