//! Engine-level conformance: random workflow programs run on the real engine over the store
//! under test, under fault schedules, checked against a reference interpreter.
//!
//! # How it works
//!
//! - [`program`](mod@program): programs are data (a serde-able tree of steps, joins, sleeps, hooks, races of
//!   a hook against a sleep, asks, races of an ask against a sleep, agent calls, progress
//!   values, messages posted by background runs, and nested blocks that catch step failures;
//!   optionally a cleanup step run when the run is cancelled), with random JSON inputs and
//!   outputs up to about a megabyte; proptest strategies generate them.
//! - [`interp`]: one generic workflow body interprets any program on the real engine. Step
//!   closures follow their script by attempt number (retryable failures, then success or a
//!   fatal error) and count their real executions.
//! - [`reference`](mod@reference): a reference interpreter computes, without any store, the run's final
//!   status and output, every step's attempts and result, the command sequence, every await,
//!   and where the run parks.
//! - [`driver`]: runs a program on a store with simulated time
//!   ([`ManualClock`](eve_core::engine::ManualClock): sleeps, retry backoffs and lease expiries
//!   cost no wall-clock time), delivers the scripted hook payloads and answers when the run
//!   parks on them (agent results come from a scripted agent host), and injects one
//!   [`Fault`] per case.
//! - [`checks`]: the properties.
//!
//! # Properties (every program × schedule, on every backend)
//!
//! - The outcome (status, output or error) equals the reference's.
//! - Each step's attempts are recorded exactly as the reference says, so each completed step's
//!   result is recorded **exactly once**; no step execution starts after its result was
//!   recorded. Steps are **at-least-once**: an attempt may execute more than once *before* its
//!   result is recorded (a crash or a lost lease between running it and recording it), so
//!   executions are only checked to be at least one per attempt, and exactly one when no fault
//!   is injected.
//! - The run parks exactly where the reference parks (a subsequence of those park points when
//!   a fault moves the clock past a lease, which may fire a short sleep early), and what it
//!   waits on is durable in the journal when it parks.
//! - A cold replay from the journal alone re-issues the reference's command sequence.
//! - Hooks take each payload as delivered: a repeated dedupe key is one event, a repeated
//!   delivery without a key is two (at-least-once); an ended run's hooks take nothing.
//! - Each request is answered at most once (an identical retry is a duplicate success, another
//!   answer `AlreadyAnswered`); every request still pending when the run ends (completed,
//!   failed or cancelled) is withdrawn, and a late answer is refused (`Withdrawn`).
//! - Agent calls record their intent, start and result once; progress values and posted
//!   messages are recorded once each, across replays and faults.
//! - A cancel request at a park point ends the run `RunCancelled`; a body with a cleanup step
//!   runs it (recorded once) in the grace period.
//! - Local steps (a quarter of the generated steps; most of them in the
//!   [`local_batch_crash`] family) commit in batches: a crash before a batch's append runs its
//!   steps again (at least once), one after it landed runs none again, and each outcome is
//!   recorded exactly once either way.
//! - A program changed between two activations at a recorded command parks the run as blocked
//!   with `[EVE-ND-001]`; nothing of the changed program runs; once the original program is
//!   deployed again and the run is resumed it ends as the reference says.
//!
//! # Fault families (one test each)
//!
//! [`no_faults`], [`crash`], [`ambiguous_commit`], [`duplicate_deliveries`] (hook payloads
//! and answers), [`duplicate_dispatch`], [`racing_workers`], [`lease_expiry`],
//! [`non_determinism`], [`cancel`], [`local_batch_crash`].
//!
//! # Environment
//!
//! - `EVE_CONFORMANCE_CASES`: programs per family whose fault fired (default
//!   [`ENGINE_DEFAULT_CASES`]; programs whose fault missed, such as a crash point past the
//!   run's last store call, are drawn on top, up to [`MAX_DRAWS`] times as many).
//! - `EVE_CONFORMANCE_DEEP=1`: [`ENGINE_DEEP_CASES`] programs per family (an explicit
//!   `EVE_CONFORMANCE_CASES` wins).
//! - `EVE_CONFORMANCE_SEED`: replay a family from this seed (each family prints its seed; a
//!   failure prints it with the shrunk program).

pub mod checks;
pub mod driver;
pub mod faults;
pub mod interp;
pub mod program;
pub mod recorder;
pub mod reference;

use crate::StoreFactory;
use driver::{run_case, Bench, Fault, Outcome, Schedule};
use program::{program, Program, Shape};
use proptest::option;
use proptest::prelude::*;
use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use reference::DeliveryMode;
use std::time::Instant;

/// Programs per fault family by default: at least 20 per family, and a server backend's
/// engine cases stay within a few minutes.
pub const ENGINE_DEFAULT_CASES: u32 = 20;
/// Programs per fault family in deep mode (`EVE_CONFORMANCE_DEEP=1`).
pub const ENGINE_DEEP_CASES: u32 = 256;
/// A family draws up to this many times its case count, until that many programs had their
/// fault fire (a crash point past a short program's last store call does not count).
pub const MAX_DRAWS: u32 = 4;
/// Runs spent shrinking a failing program.
pub const SHRINK_BUDGET: u32 = 128;

/// Programs per family: `EVE_CONFORMANCE_CASES`, else [`ENGINE_DEEP_CASES`] under
/// `EVE_CONFORMANCE_DEEP=1`, else [`ENGINE_DEFAULT_CASES`].
///
/// # Panics
/// When `EVE_CONFORMANCE_CASES` is set but is not a number.
pub fn engine_case_count() -> u32 {
    if std::env::var("EVE_CONFORMANCE_CASES").is_ok() {
        return crate::case_count();
    }
    match std::env::var("EVE_CONFORMANCE_DEEP").as_deref() {
        Ok("1") | Ok("true") | Ok("yes") => ENGINE_DEEP_CASES,
        _ => ENGINE_DEFAULT_CASES,
    }
}

/// The seed: `EVE_CONFORMANCE_SEED`, else drawn from the clock and the process id.
///
/// # Panics
/// When `EVE_CONFORMANCE_SEED` is set but is not a u64.
pub fn seed() -> u64 {
    match std::env::var("EVE_CONFORMANCE_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("EVE_CONFORMANCE_SEED={s:?} is not a u64 seed")),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// A generated case: a program and its schedule.
pub type Case = (Program, Schedule);

fn modes() -> impl Strategy<Value = Vec<DeliveryMode>> {
    proptest::collection::vec(
        prop_oneof![
            Just(DeliveryMode::Once),
            Just(DeliveryMode::Keyed),
            Just(DeliveryMode::KeyedTwice),
            Just(DeliveryMode::KeyedRetryLater),
            Just(DeliveryMode::UnkeyedTwice),
        ],
        1..4,
    )
}

fn with(shape: Shape, fault: BoxedStrategy<Fault>, dup: bool) -> BoxedStrategy<Case> {
    let deliveries = if dup {
        modes().boxed()
    } else {
        Just(vec![DeliveryMode::Keyed]).boxed()
    };
    (program(shape), fault, deliveries)
        .prop_map(|(p, fault, deliveries)| (p, Schedule { fault, deliveries }))
        .boxed()
}

/// The strategy of a family.
pub fn strategy(family: Family) -> BoxedStrategy<Case> {
    let shape = Shape::default();
    match family {
        Family::NoFaults => with(shape, Just(Fault::None).boxed(), false),
        Family::Crash => with(
            shape,
            (any::<u16>(), prop::bool::weighted(0.3))
                .prop_map(|(after, ambiguous)| Fault::Crash { after, ambiguous })
                .boxed(),
            false,
        ),
        Family::AmbiguousCommit => with(
            shape,
            any::<u16>().prop_map(|at| Fault::Ambiguous { at }).boxed(),
            false,
        ),
        Family::DuplicateDeliveries => with(
            Shape {
                must_park: true,
                park_on_hook: true,
                ..shape
            },
            Just(Fault::None).boxed(),
            true,
        ),
        Family::DuplicateDispatch => with(
            shape,
            any::<bool>()
                .prop_map(|concurrent| Fault::DuplicateDispatch { concurrent })
                .boxed(),
            false,
        ),
        Family::RacingWorkers => with(shape, Just(Fault::RacingWorkers).boxed(), true),
        Family::LeaseExpiry => with(
            shape,
            (any::<u16>(), any::<bool>())
                .prop_map(|(step, concurrent)| Fault::LeaseExpiry { step, concurrent })
                .boxed(),
            false,
        ),
        Family::Cancel => (
            program(Shape {
                must_park: true,
                ..shape
            }),
            (any::<u16>(), any::<bool>()),
            option::of(program::step_spec(1 << 16, shape.local_percent)),
            modes(),
        )
            .prop_map(|(mut p, (park, twice), cleanup, deliveries)| {
                p.cleanup = cleanup.map(|mut c| {
                    // A failing cleanup would change nothing (the run ends cancelled anyway);
                    // keep it succeeding so that its result is checked.
                    c.name = "cleanup".into();
                    c.failures = 0;
                    c.fatal = false;
                    c
                });
                (
                    p,
                    Schedule {
                        fault: Fault::Cancel { park, twice },
                        deliveries,
                    },
                )
            })
            .boxed(),
        Family::LocalBatchCrash => with(
            Shape {
                local_percent: 80,
                ..shape
            },
            (any::<u16>(), any::<bool>())
                .prop_map(|(step, landed)| Fault::LocalBatchCrash { step, landed })
                .boxed(),
            false,
        ),
        Family::NonDeterminism => with(
            Shape {
                must_park: true,
                ..shape
            },
            (any::<u16>(), any::<u16>(), prop::bool::weighted(0.3))
                .prop_map(|(park, target, remove)| Fault::NonDeterminism {
                    park,
                    target,
                    remove,
                })
                .boxed(),
            false,
        ),
    }
}

/// The fault families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// No fault: exact executions and parks.
    NoFaults,
    /// A crash after any store call (sometimes right after a write landed).
    Crash,
    /// An ambiguous commit at any store call.
    AmbiguousCommit,
    /// Hook payloads delivered twice, with and without a dedupe key, also late.
    DuplicateDeliveries,
    /// The same tool call dispatched two and three times.
    DuplicateDispatch,
    /// Two workers draining at once.
    RacingWorkers,
    /// A lease expiring while a step runs.
    LeaseExpiry,
    /// A program changed between activations.
    NonDeterminism,
    /// A cancel request while the run is parked, with and without a cleanup step.
    Cancel,
    /// A crash inside a batch of local steps, before its append or while it lands.
    LocalBatchCrash,
}

impl Family {
    /// Whether every program counts towards the case count (no fault, or a fault that cannot
    /// miss); otherwise only those whose fault fired.
    pub fn counts_every_case(self) -> bool {
        matches!(self, Family::NoFaults | Family::RacingWorkers)
    }

    /// Its name in test names and messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::NoFaults => "no_faults",
            Family::Crash => "crash",
            Family::AmbiguousCommit => "ambiguous_commit",
            Family::DuplicateDeliveries => "duplicate_deliveries",
            Family::DuplicateDispatch => "duplicate_dispatch",
            Family::RacingWorkers => "racing_workers",
            Family::LeaseExpiry => "lease_expiry",
            Family::NonDeterminism => "non_determinism",
            Family::Cancel => "cancel",
            Family::LocalBatchCrash => "local_batch_crash",
        }
    }
}

/// Runs programs of `family` from `seed` on a fresh store of `factory` until `cases` of them
/// had their fault fire (at most [`MAX_DRAWS`] × `cases` programs); `Err` holds the shrunk
/// failing program, the seed and what broke.
///
/// # Errors
/// The first case that broke a property, shrunk.
pub async fn check_family(
    factory: &dyn StoreFactory,
    family: Family,
    cases: u32,
    seed: u64,
) -> Result<String, String> {
    let bench = Bench::new(factory, family.name())
        .await
        .map_err(|e| format!("the factory could not create a store: {e}"))?;
    check_family_on(&bench, family, cases, seed).await
}

/// [`check_family`] on an existing bench.
///
/// # Errors
/// The first case that broke a property, shrunk.
pub async fn check_family_on(
    bench: &Bench,
    family: Family,
    cases: u32,
    seed: u64,
) -> Result<String, String> {
    let started = Instant::now();
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(
            &(seed
                .wrapping_add(i as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .to_le_bytes(),
        );
    }
    // Proptest's value trees are not `Send`: generation and shrinking run on their own thread
    // and hand each case to this task, which runs it on the store.
    let (to_runner, mut incoming) = tokio::sync::mpsc::unbounded_channel::<(u32, Case)>();
    let (to_generator, verdicts) = std::sync::mpsc::channel::<bool>();
    let generator = std::thread::spawn(move || {
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        );
        let strategy = strategy(family);
        let run = |case: u32, c: Case| -> Option<bool> {
            to_runner.send((case, c)).ok()?;
            verdicts.recv().ok()
        };
        for case in 0..cases.saturating_mul(MAX_DRAWS) {
            let mut tree = strategy.new_tree(&mut runner).expect("generate a case");
            match run(case, tree.current()) {
                Some(true) => continue,
                Some(false) => {}
                None => return,
            }
            if !tree.simplify() {
                return;
            }
            for _ in 0..SHRINK_BUDGET {
                match run(case, tree.current()) {
                    Some(false) if tree.simplify() => {}
                    Some(true) if tree.complicate() => {}
                    _ => return,
                }
            }
            return;
        }
    });
    let mut failure: Option<(u32, Case, String)> = None;
    let mut stats: Vec<Outcome> = Vec::new();
    let mut runs = 0;
    let mut counted = 0;
    while let Some((case, c)) = incoming.recv().await {
        runs += 1;
        let result = run_case(bench, &c.0, &c.1).await;
        let passed = result.is_ok();
        match result {
            Ok(o) => {
                if failure.is_none() {
                    if o.fired || family.counts_every_case() {
                        counted += 1;
                    }
                    stats.push(o);
                }
            }
            Err(why) => failure = Some((case, c, why)),
        }
        if failure.is_none() && counted >= cases {
            break;
        }
        if to_generator.send(passed).is_err() {
            break;
        }
    }
    // Dropping both ends stops the generator wherever it waits.
    drop(to_generator);
    drop(incoming);
    generator
        .join()
        .expect("the program generator thread panicked");
    let name = family.name();
    let backend = bench.store.backend();
    if let Some((case, (program, _), why)) = failure {
        let json = serde_json::to_string(&program).unwrap_or_default();
        return Err(format!(
            "engine {name} on {backend}: program {case} broke a property (seed {seed}; rerun with EVE_CONFORMANCE_SEED={seed}); shrunk in {} runs to:\n  program: {program:#?}\n  program as JSON: {json}\n  {why}",
            runs - case - 1
        ));
    }
    let fired = stats.iter().filter(|o| o.fired).count();
    let parks: usize = stats.iter().map(|o| o.parks).sum();
    let execs: u32 = stats.iter().map(|o| o.executions).sum();
    let steps: usize = stats.iter().map(|o| o.steps).sum();
    let stale: usize = stats.iter().map(|o| o.stale).sum();
    let failed = stats
        .iter()
        .filter(|o| o.status == Some(eve_core::RunStatus::Failed))
        .count();
    Ok(format!(
        "engine {name} on {backend}: {} programs passed in {:.1?} (seed {seed}); the fault fired in {fired}, {failed} runs failed as scripted, {steps} steps ({execs} executions{}), {parks} parks",
        stats.len(),
        started.elapsed(),
        if stale > 0 {
            format!(", {stale} stale: started by a worker after its lease expired and the step's outcome was recorded by the worker that took over, each refused by its fencing token")
        } else {
            String::new()
        }
    ))
}

async fn family_case(factory: &dyn StoreFactory, family: Family) {
    let seed = seed();
    let cases = engine_case_count();
    println!(
        "engine {}: {cases} programs, seed {seed} (EVE_CONFORMANCE_SEED={seed} replays them)",
        family.name()
    );
    match check_family(factory, family, cases, seed).await {
        Ok(summary) => println!("{summary}"),
        Err(why) => panic!("{why}"),
    }
}

/// Programs without faults: outcome, journal, executions (exactly one per attempt), parks
/// (exactly the reference's) and cold replay match the reference.
pub async fn no_faults(factory: &dyn StoreFactory) {
    family_case(factory, Family::NoFaults).await
}

/// A worker crashes after any store call (also right after a write landed); a new worker takes
/// over after the lease expired; every property still holds (executions at least once).
pub async fn crash(factory: &dyn StoreFactory) {
    family_case(factory, Family::Crash).await
}

/// An ambiguous commit (the write landed, the answer was lost) at any store call.
pub async fn ambiguous_commit(factory: &dyn StoreFactory) {
    family_case(factory, Family::AmbiguousCommit).await
}

/// Hook payloads delivered twice with one dedupe key (one event, a duplicate answer, also
/// when retried late) and twice without a key (two events, the body sees both).
pub async fn duplicate_deliveries(factory: &dyn StoreFactory) {
    family_case(factory, Family::DuplicateDeliveries).await
}

/// The same tool call dispatched twice (one after the other or concurrently) and once more
/// after its run ended: one run, created once, never activated again.
pub async fn duplicate_dispatch(factory: &dyn StoreFactory) {
    family_case(factory, Family::DuplicateDispatch).await
}

/// Two workers draining the store at the same time throughout the run.
pub async fn racing_workers(factory: &dyn StoreFactory) {
    family_case(factory, Family::RacingWorkers).await
}

/// A step still runs while its worker's lease expires; a second worker takes the run over
/// (and the first goes on at the same time, or after the second parked).
///
/// The first worker does not know it lost the run until a write is fenced: meanwhile it may
/// start another step attempt (a retry whose backoff ended when the clock jumped) that the
/// second worker already ran and recorded. No time-based lease excludes that; what holds is
/// that every such attempt carries a fencing token below the one the second worker's
/// attempts showed, so the steps' service (a fencing check in the test interpreter) refuses
/// it. Any late attempt it would not refuse fails the case; the refused ones are counted in
/// the family's summary line as stale.
pub async fn lease_expiry(factory: &dyn StoreFactory) {
    family_case(factory, Family::LeaseExpiry).await
}

/// A cancel request reaches a parked run (once or twice): a body with a cleanup step runs it
/// in the grace period (simulated time), one without is abandoned; the run ends
/// `RunCancelled`, its pending requests withdrawn, its hooks closed, every step before the
/// cancel recorded once.
pub async fn cancel(factory: &dyn StoreFactory) {
    family_case(factory, Family::Cancel).await
}

/// A worker crashes inside a batch of local steps (their outcomes delivered to the body, not
/// yet committed): before the batch's append (the uncommitted steps run again: at least once)
/// or right after it landed (none runs again); a new worker takes over after the lease
/// expired, and every outcome is recorded exactly once.
pub async fn local_batch_crash(factory: &dyn StoreFactory) {
    family_case(factory, Family::LocalBatchCrash).await
}

/// A program changed at a recorded command while its run is parked is detected
/// (`[EVE-ND-001]`, run blocked, nothing of the change runs) and the run resumes once the
/// original program is back.
pub async fn non_determinism(factory: &dyn StoreFactory) {
    family_case(factory, Family::NonDeterminism).await
}
