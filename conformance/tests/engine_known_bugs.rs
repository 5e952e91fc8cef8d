//! Engine bugs the engine-level suite found, as minimal reproductions: regression tests once
//! eve-core is fixed, `#[ignore]`d while open (run those with
//! `cargo test -p eve-conformance --test engine_known_bugs -- --ignored`).

use eve_conformance::engine::driver::{run_case, Bench, Fault, Schedule};
use eve_conformance::engine::program::{Node, Output, Program, StepSpec};
use eve_core::MemoryStore;
use std::sync::Arc;

fn step(name: &str) -> StepSpec {
    StepSpec {
        name: name.into(),
        failures: 0,
        retries: 0,
        fatal: false,
        output: Output::Json(serde_json::json!(1)),
        local: false,
    }
}

/// Found by the crash family. A body sleeps, then runs a step. When the sleep was due the
/// worker appended `SleepFired`, which moved the run's processed seq past it; if the worker
/// died after that append landed and before its next write (a crash at the next store call,
/// or an ambiguous commit of that append and then the crash), the run was left Running with no
/// due timer and no undelivered event, and no worker ever claimed it again. First fixed in
/// eve-core 0c2b707 by journaling a guard timer with such events; now fixed by the store
/// contract itself: the run still names its dead owner, and a run whose owner's lease is no
/// longer valid is claimable (no guard timer is written any more). Every crash point, plain
/// and ambiguous, is tried here; every run must complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_right_after_sleep_fired_landed_strands_the_run() {
    let bench = Bench::on(Arc::new(MemoryStore::new()), "stranded");
    let program = Program {
        input: serde_json::json!({}),
        body: vec![Node::Sleep { ms: 1000 }, Node::Step(step("s0"))],
        cleanup: None,
        background: false,
    };
    let mut failures = Vec::new();
    for ambiguous in [false, true] {
        for after in 0..16u16 {
            let schedule = Schedule {
                fault: Fault::Crash { after, ambiguous },
                deliveries: vec![],
            };
            if let Err(why) = run_case(&bench, &program, &schedule).await {
                failures.push(format!(
                    "crash after store call {after} (ambiguous: {ambiguous}): {}",
                    why.lines().next().unwrap_or_default()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Found by the lease-expiry family: a worker whose lease expired while one of its steps ran
/// goes on starting step attempts (a retry whose backoff ended when the clock jumped past the
/// lease) without knowing it lost the run, so it may start an attempt that the worker which
/// took the run over has already run and recorded. No time-based lease excludes that; what is
/// guaranteed now is fencing: every such late attempt carries a `StepCtx::fencing_token` below
/// the token the new owner's attempts showed, so a service that keeps the largest token per
/// run refuses it. The family's checks fail on any late attempt such a service would let
/// through; this runs many programs of it (about 1 in 100 shows a stale attempt) and prints how
/// many late attempts were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_attempts_after_a_takeover_are_all_fenced() {
    let bench = Bench::on(Arc::new(MemoryStore::new()), "stale");
    let seed = eve_conformance::engine::seed();
    let summary = eve_conformance::engine::check_family_on(
        &bench,
        eve_conformance::engine::Family::LeaseExpiry,
        400,
        seed,
    )
    .await
    .unwrap_or_else(|why| panic!("{why}"));
    println!("{summary}");
}
