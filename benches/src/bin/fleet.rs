//! Fleets (issue 28 item 4): N worker processes of this binary, each with its own worker id and
//! the same deployment, on one store (a fresh Postgres schema at `EVE_TEST_POSTGRES_URL`, or a
//! fresh table on DynamoDB Local at `EVE_TEST_DYNAMODB_ENDPOINT`).
//!
//! `run` starts the processes, enqueues R runs of `fleet_steps` (S steps each; every step first
//! appends `run step worker ms` to its process's execution log, then returns the worker id, so the
//! journal says who recorded each step and the logs say who executed it), tells the processes to
//! go, optionally SIGKILLs (a real `kill -9`) the process holding the most runs once a fraction
//! of all steps was recorded (among the processes that recorded a step in the runs they hold:
//! one that started late and recorded nothing yet is not the one killed), waits until every run
//! ended, and checks from the journals and the logs that:
//!
//! - every run completed, with exactly one `RunCompleted`, and each of its S steps recorded
//!   exactly once;
//! - every step was executed exactly once, except the killed process's in-flight steps: a step
//!   the killed process executed but whose result it never recorded may have been executed once
//!   more (by the process that took the run over), at most one such step per run (runs are
//!   sequential); a step whose result the killed process did record is never executed again;
//! - each run the killed process held moved: another process started executing its steps
//!   within the lease + 1 s of the kill (the execution log lines carry their start time). That
//!   bound holds when the other processes have free slots (`--max-active`) when the lease
//!   lapses: claims take runs in claim-key order, and an orphaned run's key is its last write,
//!   so runs enqueued before it and still waiting go first. The test gives each process exactly
//!   its share (runs = procs × max-active), so the queue is empty and the survivors' own runs
//!   end before the lease lapses.
//!
//! A live process whose lease lapses (a stall longer than the lease) loses its runs too, and
//! their in-flight steps run again elsewhere: the check reports those as violations, since only
//! the killed process is allowed a second execution.
//!
//! It prints one JSON line (throughput, the takeover times, the CPU seconds of the workers, the
//! database, the driver and the machine, and any violation) and exits 1 when a check failed.
//! `bench` runs `run` for 1, 2 and 4 processes (no kill) on each backend given and prints the
//! JSON lines and a table. `worker` is the process `run` starts.
//!
//! ```sh
//! cargo run --release -p eve-benches --bin fleet -- bench --backend postgres --backend dynamodb
//! cargo run --release -p eve-benches --bin fleet -- run --backend postgres --procs 3 \
//!     --lease-ms 2000 --kill-at 0.5
//! ```

use clap::{Parser, Subcommand};
use eve_core::engine::{
    define_workflow_tool, tool_call_run, Registry, StepCtx, SystemClock, Worker, WorkerConfig,
    WorkflowCtx, WorkflowError, WorkflowTool,
};
use eve_core::{
    workflow, CallId, DeploymentId, Event, JournalStore, JournalStoreExt, RunId, RunQuery,
    RunStatus, SessionId, Timestamp, WorkerId,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command as Process, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

/// The deployment every fleet process serves.
const DEPLOYMENT: &str = "fleet";

/// This process's worker id (what its steps return).
static WORKER: OnceLock<String> = OnceLock::new();
/// This process's execution log: one `run step worker ms` line per step execution (`ms`: its
/// start, wall clock), written with
/// one `write` on a file opened for appending, so a SIGKILL never leaves half a line.
static EXEC_LOG: OnceLock<std::fs::File> = OnceLock::new();
/// Milliseconds every step sleeps after logging its execution.
static DELAY_MS: AtomicU32 = AtomicU32::new(0);

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Input {
    steps: u32,
}

/// A step's result: the worker that executed it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Exec {
    w: String,
}

async fn fleet_steps(ctx: WorkflowCtx, input: Input) -> Result<u32, WorkflowError> {
    for i in 1..=input.steps {
        ctx.step(format!("s{i}"), move |sc: StepCtx| async move {
            let w = WORKER.get().cloned().unwrap_or_default();
            if let Some(mut log) = EXEC_LOG.get() {
                let line = format!("{} {i} {w} {}\n", sc.run_id(), Timestamp::now().millis());
                log.write_all(line.as_bytes())
                    .map_err(|e| eve_core::engine::StepError::fatal(e.to_string()))?;
            }
            let delay = DELAY_MS.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay.into())).await;
            }
            Ok(Exec { w })
        })
        .await?;
    }
    Ok(input.steps)
}

fn registry() -> Registry {
    let tool: WorkflowTool =
        define_workflow_tool("S steps, each naming its worker.", workflow!(fleet_steps))
            .named("fleet_steps");
    Registry::new(DEPLOYMENT).with(tool)
}

#[derive(Parser)]
#[command(about = "Fleets of worker processes on one store: exactly once, takeover, throughput")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What one fleet run does.
#[derive(clap::Args, Clone, Debug)]
struct FleetArgs {
    /// `postgres` or `dynamodb`.
    #[arg(long)]
    backend: String,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    procs: usize,
    /// Runs enqueued.
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Steps per run.
    #[arg(long, default_value_t = 5)]
    steps: u32,
    /// Each worker's lease in milliseconds (renewed at a third).
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// Runs active at once per worker.
    #[arg(long, default_value_t = 64)]
    max_active: usize,
    /// Milliseconds every step sleeps.
    #[arg(long, default_value_t = 0)]
    delay_ms: u32,
    /// SIGKILL the process holding the most runs once this fraction of all steps was recorded.
    #[arg(long)]
    kill_at: Option<f64>,
    /// Where the execution logs go (default: a temp dir removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Leave the schema or table on the server (the fleet test reads the journals after the
    /// run). Without it, it is removed at the end unless a check failed.
    #[arg(long)]
    keep: bool,
}

#[derive(Subcommand)]
enum Command {
    /// One fleet: start, enqueue, (kill,) wait, check; one JSON line.
    Run {
        #[command(flatten)]
        args: FleetArgs,
    },
    /// Throughput of 1, 2 and 4 processes (no kill) on each backend; JSON lines and a table.
    Bench {
        /// Backends (`postgres`, `dynamodb`); repeat the flag for several.
        #[arg(long, required = true)]
        backend: Vec<String>,
        /// Process counts.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        procs: Vec<usize>,
        /// Runs enqueued per fleet.
        #[arg(long, default_value_t = 1000)]
        runs: usize,
        /// Steps per run.
        #[arg(long, default_value_t = 5)]
        steps: u32,
    },
    /// A worker process (started by `run`): prints `ready`, waits for `go` on stdin, works
    /// until stdin closes, then prints `cpu SECONDS` and exits.
    Worker {
        #[arg(long)]
        target: String,
        #[arg(long)]
        worker_id: String,
        #[arg(long)]
        lease_ms: u64,
        #[arg(long)]
        max_active: usize,
        #[arg(long)]
        exec_log: PathBuf,
        #[arg(long, default_value_t = 0)]
        delay_ms: u32,
    },
}

/// CPU seconds (user + system) of process `pid` so far; 0 when it is gone.
fn proc_cpu(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Linux reports in clock ticks of 1/100 s (USER_HZ) on every common configuration.
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds of every process whose command name is `comm` (the database's processes).
fn comm_cpu(comm: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .map(|p| proc_cpu(&p))
        .sum()
}

/// Busy and total CPU seconds of the whole machine so far (all cores).
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    ((total - idle) / 100.0, total / 100.0)
}

/// One worker process as the driver sees it.
struct Proc {
    id: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn start(exe: &Path, target: &str, id: &str, args: &FleetArgs, dir: &Path, k: usize) -> Self {
        let err = std::fs::File::create(dir.join(format!("worker-{k}.err"))).expect("stderr file");
        let mut child = Process::new(exe)
            .args(["worker", "--target", target, "--worker-id", id])
            .args(["--lease-ms", &args.lease_ms.to_string()])
            .args(["--max-active", &args.max_active.to_string()])
            .args(["--delay-ms", &args.delay_ms.to_string()])
            .arg("--exec-log")
            .arg(dir.join(format!("exec-{k}.log")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("start a worker process");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            id: id.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    /// The next line starting with `prefix`, within `timeout`.
    fn expect(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let until = Instant::now() + timeout;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
}

/// The SIGKILL of one process, and how its runs moved.
#[derive(serde::Serialize)]
struct Kill {
    worker: String,
    pid: u32,
    /// Wall time of the SIGKILL (ms since the epoch).
    at_ms: i64,
    /// Runs the killed process held, still running, right after it was reaped.
    orphaned: Vec<String>,
    /// For each orphaned run: kill → the first step execution by another process (ms).
    moved_ms: Vec<i64>,
    moved_max_ms: i64,
    /// The lease + 1 s: the bound `moved_max_ms` must stay within.
    bound_ms: i64,
    /// Steps executed twice (the killed process's unrecorded in-flight steps).
    reexecuted: usize,
    /// Kill → the last end of a run the killed process did not hold (ms): until then the
    /// other processes had their own runs, which may have filled their slots.
    others_done_ms: i64,
    /// Worker CPU seconds up to the kill.
    cpu_s: f64,
}

async fn fleet(args: &FleetArgs) -> serde_json::Value {
    let tag = RunId::random().as_str()[4..16].to_owned();
    let (target, db_comm) = match args.backend.as_str() {
        "postgres" => (format!("postgres:fleet_{tag}"), "postgres"),
        "dynamodb" => (format!("dynamodb:fleet_{tag}"), "java"),
        other => panic!("unknown backend {other}; use postgres or dynamodb"),
    };
    let store = eve_benches::open_new_target(&target).await;
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    std::fs::create_dir_all(&dir).expect("log dir");
    let exe = std::env::current_exe().expect("this binary");
    let mut procs: Vec<Proc> = (0..args.procs)
        .map(|k| {
            let id = format!("fleet-{tag}-w{k}");
            Proc::start(&exe, &target, &id, args, &dir, k)
        })
        .collect();
    for p in &procs {
        p.expect("ready", Duration::from_secs(60))
            .unwrap_or_else(|| panic!("worker {} did not start; see {}", p.id, dir.display()));
    }

    // Enqueue every run before any process claims, 16 creates in flight.
    let reg = Arc::new(registry());
    let session = SessionId::new(format!("fleet-{tag}"));
    let gate = Arc::new(tokio::sync::Semaphore::new(16));
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..args.runs {
        let (store, reg, session, gate) =
            (store.clone(), reg.clone(), session.clone(), gate.clone());
        let input = serde_json::json!({ "steps": args.steps });
        creates.spawn(async move {
            let _permit = gate.acquire().await.expect("semaphore");
            let new = tool_call_run(
                &reg,
                &session,
                &CallId::new(format!("c{i}")),
                "fleet_steps",
                input,
            )
            .expect("start request");
            store
                .create_run(new, Timestamp::now())
                .await
                .expect("create a run")
        });
    }
    while let Some(done) = creates.join_next().await {
        done.expect("create task");
    }

    let cpu_of = |p: &Proc| proc_cpu(&p.child.id().to_string());
    let (db0, (busy0, total0)) = (comm_cpu(db_comm), machine_cpu());
    let driver0 = proc_cpu("self");
    let go_at = Timestamp::now();
    let t0 = Instant::now();
    for p in &mut procs {
        let stdin = p.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .expect("tell a worker to go");
    }

    let running = RunQuery {
        status: Some(RunStatus::Running),
        deployment: Some(DeploymentId::new(DEPLOYMENT)),
        ..RunQuery::default()
    };
    let mut kill: Option<Kill> = None;
    let mut victim = None;
    loop {
        // Listing the running runs is a store query over all of them (a GSI read of every
        // running run on DynamoDB): often while a kill is due, else once a second, so that the
        // driver does not compete with the fleet. Throughput comes from the journals' times,
        // not from when this loop noticed the end.
        let pause = if args.kill_at.is_some() && kill.is_none() {
            200
        } else {
            1000
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        for (k, p) in procs.iter_mut().enumerate() {
            if Some(k) == victim {
                continue;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "worker {} exited on its own ({status}); see {}",
                    p.id,
                    dir.display()
                );
            }
        }
        let left = store.list_runs(&running).await.expect("list running runs");
        if left.is_empty() {
            break;
        }
        // Steps recorded so far: those of the runs that ended, and each running run's journal
        // length less its `RunStarted`.
        let done = (args.runs - left.len()) as u64 * u64::from(args.steps)
            + left
                .iter()
                .map(|r| r.next_seq.saturating_sub(1))
                .sum::<u64>();
        if let (Some(frac), None) = (args.kill_at, &kill) {
            if done as f64 >= frac * args.runs as f64 * f64::from(args.steps) {
                // The process holding the most runs, among those that recorded a step in
                // them: a process that started late (a slow first request) and recorded
                // nothing yet would make a kill that tests no recorded work. None yet: wait.
                let mut held: HashMap<&str, (u64, usize)> = HashMap::new();
                for r in &left {
                    if let Some((w, _)) = &r.owner {
                        let h = held.entry(w.as_str()).or_default();
                        h.0 += r.next_seq.saturating_sub(1);
                        h.1 += 1;
                    }
                }
                let Some(k) = (0..procs.len())
                    .filter_map(|k| held.get(procs[k].id.as_str()).map(|h| (k, *h)))
                    .filter(|(_, (recorded, _))| *recorded > 0)
                    .max_by_key(|(_, (_, runs))| *runs)
                    .map(|(k, _)| k)
                else {
                    continue;
                };
                let p = &mut procs[k];
                let cpu_s = cpu_of(p);
                let at = Timestamp::now();
                p.child.kill().expect("SIGKILL");
                p.child.wait().expect("reap the killed process");
                let me = WorkerId::new(&p.id);
                let orphaned = store
                    .list_runs(&running)
                    .await
                    .expect("list running runs")
                    .into_iter()
                    .filter(|r| r.owner.as_ref().is_some_and(|(w, _)| *w == me))
                    .map(|r| r.run_id.to_string())
                    .collect();
                kill = Some(Kill {
                    worker: p.id.clone(),
                    pid: p.child.id(),
                    at_ms: at.millis(),
                    orphaned,
                    moved_ms: Vec::new(),
                    moved_max_ms: 0,
                    bound_ms: i64::try_from(args.lease_ms).unwrap_or(i64::MAX) + 1000,
                    reexecuted: 0,
                    others_done_ms: 0,
                    cpu_s,
                });
                victim = Some(k);
            }
        }
    }
    let wall = t0.elapsed();
    let mut worker_cpu: Vec<f64> = procs
        .iter()
        .enumerate()
        .map(|(k, p)| if Some(k) == victim { 0.0 } else { cpu_of(p) })
        .collect();
    let (db1, (busy1, total1)) = (comm_cpu(db_comm), machine_cpu());
    let driver1 = proc_cpu("self");
    // Close every stdin: the workers shut down and report their CPU.
    for (k, p) in procs.iter_mut().enumerate() {
        p.stdin.take();
        if Some(k) != victim {
            if let Some(line) = p.expect("cpu ", Duration::from_secs(30)) {
                worker_cpu[k] = line[4..].trim().parse().unwrap_or(worker_cpu[k]);
            }
            p.child.wait().expect("worker exit");
        }
    }
    if let (Some(k), Some(kl)) = (victim, &kill) {
        worker_cpu[k] = kl.cpu_s;
    }

    let (violations, last_end, reexecuted, moved, others_end) =
        check(&*store, args, &dir, kill.as_ref(), go_at).await;
    if let Some(kl) = kill.as_mut() {
        kl.others_done_ms = others_end.millis() - kl.at_ms;
        kl.reexecuted = reexecuted;
        kl.moved_max_ms = moved.iter().copied().max().unwrap_or(0);
        kl.moved_ms = moved;
    }
    let span = last_end.since(go_at).as_secs_f64().max(1e-3);
    let steps = args.runs as f64 * f64::from(args.steps);
    let wall_s = wall.as_secs_f64();
    let machine_busy = (busy1 - busy0) / (total1 - total0).max(1e-9);
    if !args.keep && violations.is_empty() {
        eve_benches::drop_target(&target).await;
    }
    serde_json::json!({
        "workload": "fleet", "backend": args.backend, "procs": args.procs, "runs": args.runs,
        "steps_per_run": args.steps, "lease_ms": args.lease_ms, "max_active": args.max_active,
        "delay_ms": args.delay_ms,
        "span_s": span, "runs_per_s": args.runs as f64 / span, "steps_per_s": steps / span,
        "wall_s": wall_s,
        "cpu": {
            "workers_s": worker_cpu, "workers_total_s": worker_cpu.iter().sum::<f64>(),
            "db_s": db1 - db0, "db_process": db_comm, "driver_s": driver1 - driver0,
            "machine_busy_frac": machine_busy,
            "cores": std::thread::available_parallelism().map_or(0, usize::from),
        },
        "kill": kill, "violations": violations, "target": target,
        "dir": args.dir.as_ref().map(|d| d.display().to_string()),
    })
}

/// Checks the journals and the execution logs (see the module docs); returns the violations,
/// the last run's end, how many steps were executed twice, and the takeover times.
async fn check(
    store: &dyn JournalStore,
    args: &FleetArgs,
    dir: &Path,
    kill: Option<&Kill>,
    go_at: Timestamp,
) -> (Vec<String>, Timestamp, usize, Vec<i64>, Timestamp) {
    let mut bad = Vec::new();
    // (run, step) → the workers that executed it, when they started.
    let mut execs: HashMap<(String, u32), Vec<(String, i64)>> = HashMap::new();
    for k in 0..args.procs {
        let log = std::fs::read_to_string(dir.join(format!("exec-{k}.log"))).unwrap_or_default();
        for line in log.lines() {
            let mut f = line.split(' ');
            let (run, step, w) = (f.next(), f.next().and_then(|s| s.parse().ok()), f.next());
            match (run, step, w, f.next().and_then(|s| s.parse().ok())) {
                (Some(run), Some(step), Some(w), Some(at)) => execs
                    .entry((run.to_owned(), step))
                    .or_default()
                    .push((w.to_owned(), at)),
                _ => bad.push(format!("exec-{k}.log: malformed line {line:?}")),
            }
        }
    }
    let all = RunQuery {
        deployment: Some(DeploymentId::new(DEPLOYMENT)),
        ..RunQuery::default()
    };
    let runs = store.list_runs(&all).await.expect("list runs");
    if runs.len() != args.runs {
        bad.push(format!(
            "{} runs in the store, {} enqueued",
            runs.len(),
            args.runs
        ));
    }
    let killed = kill.map(|k| k.worker.as_str());
    let orphaned: HashSet<&str> = kill
        .map(|k| k.orphaned.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let (mut last_end, mut reexecuted, mut moved) = (go_at, 0, Vec::new());
    let mut others_end = go_at;
    for rec in &runs {
        let run = rec.run_id.to_string();
        if rec.status != RunStatus::Completed {
            bad.push(format!("{run}: ended {:?}, not completed", rec.status));
        }
        let events = store
            .read_all(&rec.run_id, 0)
            .await
            .expect("read a journal");
        let ends = events
            .iter()
            .filter(|e| matches!(e.event, Event::RunCompleted { .. }))
            .count();
        if ends != 1 {
            bad.push(format!("{run}: {ends} RunCompleted events"));
        }
        if let Some(e) = events.last() {
            last_end = last_end.max(e.at);
            if !orphaned.contains(run.as_str()) {
                others_end = others_end.max(e.at);
            }
        }
        // step → (worker that recorded it, when), from the journal.
        let mut recorded: BTreeMap<u32, Vec<(String, Timestamp)>> = BTreeMap::new();
        for e in &events {
            if let Event::StepCompleted { name, output, .. } = &e.event {
                let step = name.trim_start_matches('s').parse().unwrap_or(0);
                let w =
                    serde_json::from_str::<Exec>(output.get()).map_or_else(|_| "?".into(), |x| x.w);
                recorded.entry(step).or_default().push((w, e.at));
            }
        }
        let mut in_flight = 0;
        for step in 1..=args.steps {
            let by = recorded.get(&step).map(Vec::as_slice).unwrap_or_default();
            if by.len() != 1 {
                bad.push(format!("{run}: step {step} recorded {} times", by.len()));
                continue;
            }
            let ran: Vec<&str> = execs
                .get(&(run.clone(), step))
                .map(|v| v.iter().map(|(w, _)| w.as_str()).collect())
                .unwrap_or_default();
            let recorder = &by[0].0;
            if !ran.contains(&recorder.as_str()) {
                bad.push(format!(
                    "{run}: step {step} recorded by {recorder}, which never ran it"
                ));
            }
            match ran.len() {
                1 => {}
                2 if killed.is_some_and(|k| {
                    ran.iter().filter(|w| **w == k).count() == 1 && recorder != k
                }) =>
                {
                    in_flight += 1;
                    reexecuted += 1;
                }
                n => bad.push(format!("{run}: step {step} executed {n} times: {ran:?}")),
            }
        }
        if in_flight > 1 {
            bad.push(format!(
                "{run}: {in_flight} steps re-executed after the kill; at most 1"
            ));
        }
        if let Some(k) = kill.filter(|_| orphaned.contains(run.as_str())) {
            // The run moved when another process started executing its steps: the first
            // execution by another process after the kill.
            let next = (1..=args.steps)
                .filter_map(|step| execs.get(&(run.clone(), step)))
                .flatten()
                .filter(|(w, at)| *w != k.worker && *at >= k.at_ms)
                .map(|(_, at)| *at)
                .min();
            match next {
                Some(at) => {
                    let ms = at - k.at_ms;
                    if ms > k.bound_ms {
                        bad.push(format!(
                            "{run}: moved {ms} ms after the kill; bound {} ms",
                            k.bound_ms
                        ));
                    }
                    moved.push(ms);
                }
                // The killed process's last append was in flight at the kill and committed
                // after it (the server finishes a statement it received): its last step and
                // the end, in one append. Then nothing had to move.
                None if finished_in_flight(&events, &k.worker) => {}
                None => bad.push(format!(
                    "{run}: orphaned, but no later step run by another process"
                )),
            }
        }
    }
    if args.kill_at.is_some() && kill.is_none() {
        bad.push("a kill was asked for, but no process held a run it had recorded steps in".into());
    }
    if kill.is_some_and(|k| k.orphaned.is_empty()) {
        bad.push("the killed process held no running run: nothing moved".into());
    }
    moved.sort_unstable();
    (bad, last_end, reexecuted, moved, others_end)
}

/// Whether the run's last step was recorded by `worker` in the append that ended the run.
fn finished_in_flight(events: &[eve_core::StoredEvent], worker: &str) -> bool {
    let mut it = events.iter().rev();
    match (it.next(), it.next()) {
        (Some(end), Some(step)) => {
            matches!(end.event, Event::RunCompleted { .. })
                && end.at == step.at
                && matches!(&step.event, Event::StepCompleted { output, .. }
                    if serde_json::from_str::<Exec>(output.get()).is_ok_and(|x| x.w == worker))
        }
        _ => false,
    }
}

async fn worker_process(
    target: String,
    id: String,
    lease_ms: u64,
    max_active: usize,
    exec_log: PathBuf,
    delay_ms: u32,
) {
    DELAY_MS.store(delay_ms, Ordering::Relaxed);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&exec_log)
        .expect("open the execution log");
    EXEC_LOG.set(log).expect("one log");
    WORKER.set(id.clone()).expect("one worker id");
    let store = eve_benches::open_target(&target).await;
    let config = WorkerConfig {
        id: Some(WorkerId::new(id)),
        lease_ttl: Duration::from_millis(lease_ms),
        max_active_runs: max_active,
        ..WorkerConfig::default()
    };
    let w = match Worker::new(store, registry(), Arc::new(SystemClock), config).await {
        Ok(w) => w,
        Err(e) => {
            eprintln!("cannot start the worker: {e}");
            std::process::exit(4);
        }
    };
    println!("ready");
    // stdin: `go`, then end of file to stop.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel();
    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut lines = std::io::stdin().lock().lines();
        let _ = lines.next();
        let _ = go_tx.send(());
        for _ in lines.by_ref() {}
        let _ = eof_tx.send(());
    });
    let _ = go_rx.await;
    let mut handle = w.spawn();
    tokio::select! {
        _ = eof_rx => handle.shutdown().await,
        e = handle.stopped() => {
            eprintln!("worker stopped: {e:?}");
            std::process::exit(3);
        }
    }
    println!("cpu {}", proc_cpu("self"));
}

fn table(rows: &[serde_json::Value]) {
    println!(
        "\n| backend | procs | runs | steps/s | runs/s | workers CPU s | db CPU s | machine busy |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0}% |",
            r["backend"].as_str().unwrap_or("?"),
            r["procs"],
            r["runs"],
            r["steps_per_s"].as_f64().unwrap_or(0.0),
            r["runs_per_s"].as_f64().unwrap_or(0.0),
            r["cpu"]["workers_total_s"].as_f64().unwrap_or(0.0),
            r["cpu"]["db_s"].as_f64().unwrap_or(0.0),
            r["cpu"]["machine_busy_frac"].as_f64().unwrap_or(0.0) * 100.0,
        );
    }
}

fn main() {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        match cli.command {
            Command::Run { args } => {
                let report = fleet(&args).await;
                println!("{report}");
                let failed = report["violations"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty());
                if failed {
                    std::process::exit(1);
                }
            }
            Command::Bench {
                backend,
                procs,
                runs,
                steps,
            } => {
                let mut rows = Vec::new();
                for b in &backend {
                    for &n in &procs {
                        let args = FleetArgs {
                            backend: b.clone(),
                            procs: n,
                            runs,
                            steps,
                            lease_ms: 9000,
                            max_active: 64,
                            delay_ms: 0,
                            kill_at: None,
                            dir: None,
                            keep: false,
                        };
                        let report = fleet(&args).await;
                        println!("{report}");
                        rows.push(report);
                    }
                }
                table(&rows);
            }
            Command::Worker {
                target,
                worker_id,
                lease_ms,
                max_active,
                exec_log,
                delay_ms,
            } => worker_process(target, worker_id, lease_ms, max_active, exec_log, delay_ms).await,
        }
    });
}
