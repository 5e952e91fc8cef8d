//! Wait for an external system to call back, across processes.
//!
//! ```text
//! render start --project p1 [--db FILE]     # starts the run and works it until it ends
//! render resume --project p1 [--status ok] [--url URL] [--db FILE]   # from another shell
//! ```

use eve_core::engine::{resume_hook, start_tool_call};
use eve_core::{CallId, SessionId, Timestamp};
use eve_examples::render_hook::{token, Callback};
use eve_examples::{arg, follow, open, worker};
use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let project = arg(&args, "--project").unwrap_or_else(|| "p1".into());
    let store = open(&args).await;
    match args.get(1).map(String::as_str) {
        Some("start") => {
            // Idempotent by call id: running `start` again after a crash resumes the same run.
            let created = start_tool_call(
                &*store,
                &eve_examples::registry(),
                &SessionId::new("examples"),
                &CallId::new(format!("render-{project}")),
                "render_hook",
                serde_json::json!({ "project_id": project }),
                Timestamp::now(),
            )
            .await
            .unwrap_or_else(|e| panic!("cannot start the run: {e}"));
            let run = created.run.run_id;
            println!(
                "run {run} ({}); waiting for the render farm. From another shell:\n  cargo run -p eve-examples --bin render -- resume --project {project}{}",
                if created.created { "new" } else { "existing" },
                arg(&args, "--db").map(|d| format!(" --db {d}")).unwrap_or_default()
            );
            let w = worker(store.clone(), Duration::from_secs(10)).await;
            let status = follow(&*store, &run, "").await;
            w.shutdown().await;
            println!("run {run} ended {}", status.as_str());
        }
        Some("resume") => {
            let callback = Callback {
                status: arg(&args, "--status").unwrap_or_else(|| "ok".into()),
                url: Some(
                    arg(&args, "--url")
                        .unwrap_or_else(|| format!("https://cdn.example/{project}.mp4")),
                ),
            };
            match resume_hook(&*store, &token(&project), &callback, None, Timestamp::now()).await {
                Ok(d) => println!("delivered {callback:?} to run {} at seq {}", d.run, d.seq),
                Err(e) => {
                    eprintln!("cannot deliver: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => {
            eprintln!("use: render start|resume --project ID [--db FILE]");
            std::process::exit(2);
        }
    }
}
