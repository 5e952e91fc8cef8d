//! The reminder example, and the end-to-end demo with a worker process killed mid-run.
//!
//! ```text
//! reminder                                   # the demo (a temp SQLite file)
//! reminder start --note "stretch" --delay 3s [--db FILE]
//! reminder worker --run RUN_ID [--db FILE]   # a worker process that exits when the run ends
//! ```

use eve_core::engine::start_tool_call;
use eve_core::{
    CallId, Event, JournalStore, JournalStoreExt, RunId, RunStatus, SessionId, Timestamp,
};
use eve_examples::{arg, describe, follow, open, worker};
use std::process::Stdio;
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        None | Some("demo") => demo(&args).await,
        Some("start") => start(&args).await,
        Some("worker") => worker_process(&args).await,
        Some(other) => {
            eprintln!("unknown command {other:?}; use: reminder [demo|start|worker] ...");
            std::process::exit(2);
        }
    }
}

async fn create(store: &dyn JournalStore, call: &str, note: &str, delay: &str) -> RunId {
    let created = start_tool_call(
        store,
        &eve_examples::registry(),
        &SessionId::new("examples"),
        &CallId::new(call),
        "remind",
        serde_json::json!({ "note": note, "delay": delay }),
        Timestamp::now(),
    )
    .await
    .unwrap_or_else(|e| panic!("cannot start the run: {e}"));
    created.run.run_id
}

async fn start(args: &[String]) {
    let store = open(args).await;
    let note = arg(args, "--note").unwrap_or_else(|| "stretch your legs".into());
    let delay = arg(args, "--delay").unwrap_or_else(|| "3s".into());
    let run = create(&*store, &format!("remind-{note}-{delay}"), &note, &delay).await;
    println!("run {run}: reminding about {note:?} in {delay}");
    let w = worker(store.clone(), LEASE).await;
    let status = follow(&*store, &run, "").await;
    w.shutdown().await;
    println!("run {run} ended {}", status.as_str());
}

async fn worker_process(args: &[String]) {
    let store = open(args).await;
    let run = RunId::new(arg(args, "--run").expect("--run RUN_ID"));
    let w = worker(store.clone(), LEASE).await;
    loop {
        let status = store.get_run(&run).await.expect("get run").status;
        if status.is_terminal() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.shutdown().await;
}

fn spawn_worker(db: &str, run: &RunId, n: u32) -> tokio::process::Child {
    let exe = std::env::current_exe().expect("current exe");
    let child = tokio::process::Command::new(exe)
        .args(["worker", "--db", db, "--run", run.as_str()])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn worker process");
    println!(
        "*** started worker process {n} (pid {})",
        child.id().unwrap_or_default()
    );
    child
}

/// Starts a reminder, runs it in a child worker process, kills that process while the slow
/// `compose` step runs, starts a new worker process, and shows the run finishing with every
/// step's result recorded once.
async fn demo(args: &[String]) {
    let db = arg(args, "--db").unwrap_or_else(|| {
        std::env::temp_dir()
            .join(format!("eve-reminder-demo-{}.db", std::process::id()))
            .display()
            .to_string()
    });
    let store = open(&["--db".into(), db.clone()]).await;
    println!("eve demo: a durable reminder on SQLite file {db}");
    let run = create(&*store, "demo-reminder", "stand up and stretch", "2s").await;
    println!("run {run} started (prepare -> sleep 2s -> compose (1.5 s) -> deliver)\n");

    let mut first = spawn_worker(&db, &run, 1);
    let mut seen = 0;
    let mut killed = false;
    let mut second = None;
    loop {
        let events = store.read_all(&run, seen).await.expect("read journal");
        for e in &events {
            println!("journal seq {:>2}  {}", e.seq, describe(&e.event));
            if !killed && matches!(e.event, Event::SleepFired { cmd: 1 }) {
                // The sleep fired, so `compose` is starting in worker 1: kill it mid-step.
                tokio::time::sleep(Duration::from_millis(600)).await;
                first.kill().await.expect("kill worker 1");
                killed = true;
                println!("*** killed worker process 1 while step \"compose\" was running");
                println!("*** (the new worker waits for the dead one's 2 s lease to lapse)");
                second = Some(spawn_worker(&db, &run, 2));
            }
        }
        seen += events.len() as u64;
        let status = store.get_run(&run).await.expect("get run").status;
        if status != RunStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(mut c) = second {
        let _ = c.wait().await;
    }
    let events = store.read_all(&run, 0).await.expect("read journal");
    let mut recorded = Vec::new();
    for e in &events {
        if let Event::StepCompleted { name, .. } = &e.event {
            recorded.push(name.clone());
        }
    }
    println!(
        "\nrun {run} finished: {}",
        describe(&events.last().expect("events").event)
    );
    println!("steps recorded: {recorded:?} (each once, though compose ran twice)");
    assert_eq!(recorded, ["prepare", "compose", "deliver"]);
    assert!(killed, "the demo killed a worker mid-run");
}
