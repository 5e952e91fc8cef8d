//! eve-conformance: the suite every [`JournalStore`] must pass.
//!
//! A backend crate implements [`StoreFactory`] in its tests and calls [`store_suite!`] once; the
//! suite owns the list of cases, so a new case reaches every backend and none is skipped by
//! omission.
//!
//! ```ignore
//! // tests/conformance.rs of a backend crate
//! eve_conformance::store_suite!(MyFactory::new());
//! // a server backend: skipped loudly (not failed) when the variable is unset
//! eve_conformance::store_suite!(skip_unless = "EVE_TEST_POSTGRES_URL", PgFactory::from_env().await);
//! ```
//!
//! The factory expression is evaluated inside each generated (async) test, so it may `.await`.
//! It may yield a [`StoreFactory`], or an `Option` of one (`None` skips the case with a printed
//! `skipped:` line).
//!
//! A case that cannot run on a store reports why: [`Skip::NotApplicable`] when the backend
//! declared it cannot apply (a memory store cannot be reopened and has no rows to damage), which
//! is not a failure, and [`Skip::Missing`] when the factory lacks what the case needs, which the
//! generated test turns into a failure, so CI never counts a case that did not run as passed. Each case becomes one `#[test]` running on a two-worker multi-thread tokio
//! runtime (what `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` builds); the
//! caller needs no tokio dependency of its own.
//!
//! A binary can run the same cases with [`run_store_suite`] and [`run_engine_suite`], which
//! return a [`Report`].
//!
//! # Two levels
//!
//! - **Store cases** ([`store`]): the `JournalStore` contract, call by call, and a model-based
//!   test of random call sequences against [`model::Model`].
//! - **Engine cases** ([`engine`]), one test per fault family, named `engine_<family>`: random
//!   workflow programs (steps with retryable and fatal failures, joins, sleeps, hooks with
//!   payloads, races of a hook or an ask against a sleep, asks, agent calls, progress values,
//!   messages of background runs, nested blocks, random JSON up to a megabyte) run on the real
//!   engine over the store under test, with simulated time, under a fault schedule (a crash
//!   after any store call, an ambiguous commit, duplicate hook deliveries with and without a
//!   dedupe key and duplicate answers, duplicate dispatch of the tool call, two workers racing,
//!   a lease expiring while a step runs, a program changed between activations, a cancel
//!   request with and without a cleanup step), and checked against a reference interpreter:
//!   the outcome, every step's attempts recorded exactly once and never run after being
//!   recorded, requests answered at most once and withdrawn at the end, where the run parks, a
//!   cold replay's command sequence, and non-determinism detected (`[EVE-ND-001]`). Steps are at-least-once: an attempt may run
//!   more than once *before* its result is recorded, and the suite allows that.
//!
//! The macro expands both levels; the engine cases need nothing more from the factory than
//! [`StoreFactory::create`] (one fresh store per family; each program runs in its own
//! deployment).
//!
//! # Environment
//!
//! - `EVE_CONFORMANCE_CASES`: how many random call sequences the model-based test runs
//!   (default [`DEFAULT_CASES`], chosen so a server backend's whole store suite stays well
//!   under three minutes), and how many programs each engine family runs with its fault
//!   firing (default [`engine::ENGINE_DEFAULT_CASES`]; about two minutes for all nine families
//!   on DynamoDB Local, half a minute on Postgres and on SQLite).
//! - `EVE_CONFORMANCE_DEEP=1`: deep mode for nightly runs: [`DEEP_CASES`] sequences and
//!   [`engine::ENGINE_DEEP_CASES`] programs per family (an explicit `EVE_CONFORMANCE_CASES`
//!   wins).
//! - `EVE_CONFORMANCE_SEED`: replay a failure's printed seed (the model-based test and every
//!   engine family print theirs; a failing case is shrunk and printed with it).
//!
//! The crate's own tests add `tests/engine_differential.rs`: the same seeded programs on
//! `MemoryStore` and `SqliteStore` under a deterministic schedule give identical journals,
//! modulo timestamps and ids; `tests/engine_known_bugs.rs`: the engine bugs this suite found,
//! as minimal reproductions (regression tests once fixed, `#[ignore]`d while open).
//!
//! # Families
//!
//! [`store::appends`], [`store::starts`], [`store::deliveries`], [`store::hooks`],
//! [`store::leases`], [`store::wakeups`], [`store::reads`], [`store::limits`],
//! [`store::persistence`], [`store::isolation`], [`store::sessions`], [`store::blocked`],
//! [`store::retention`], [`store::turns`] (sessions and turns, clause 10), [`store::clauses`]
//! (directed cases, one per clause) and
//! [`store::sequences`] (the model-based test against [`model::Model`]); engine families
//! [`engine::no_faults`], [`engine::crash`], [`engine::ambiguous_commit`],
//! [`engine::duplicate_deliveries`], [`engine::duplicate_dispatch`],
//! [`engine::racing_workers`], [`engine::lease_expiry`], [`engine::non_determinism`],
//! [`engine::cancel`], [`engine::local_batch_crash`].

use async_trait::async_trait;
use eve_core::{JournalStore, RunId, StoreError};
use futures::future::BoxFuture;
use futures::FutureExt;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod engine;
pub mod fixtures;
pub mod golden;
pub mod model;
pub mod store;

/// Random call sequences the model-based test runs by default.
pub const DEFAULT_CASES: u32 = 32;
/// Random call sequences in deep mode (`EVE_CONFORMANCE_DEEP=1`).
pub const DEEP_CASES: u32 = 1024;

/// A store the factory made, with where its storage lives.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The handle under test.
    pub store: Arc<dyn JournalStore>,
    /// Where its storage lives (a file path, a schema name, a table name), for
    /// [`StoreFactory::open`].
    pub location: String,
}

/// Makes fresh, isolated stores for the suite.
#[async_trait]
pub trait StoreFactory: Send + Sync + 'static {
    /// Fresh, empty storage isolated from every other store this factory made (a new file, a
    /// random schema, a random table), and a handle on it.
    async fn create(&self) -> Result<Opened, StoreError>;

    /// A new, independent handle on existing storage, as a second process (or the same process
    /// after a restart) would open it. `Ok(None)` when the backend is not persistent (memory):
    /// the cases that need it are then skipped for that backend, and say so.
    async fn open(&self, location: &str) -> Result<Option<Arc<dyn JournalStore>>, StoreError>;

    /// Damages, behind the store's back, the stored row holding the last append of `run` in the
    /// storage at `location` (never its `RunStarted`), as disk corruption or a buggy writer
    /// would. `Ok(false)` (the default) when the factory cannot: the corruption case is then
    /// [`Skip::Missing`] (a failure of the generated test), unless
    /// [`corrupt_not_applicable`](Self::corrupt_not_applicable) says why it cannot apply.
    async fn corrupt(
        &self,
        location: &str,
        run: &RunId,
        how: Corruption,
    ) -> Result<bool, StoreError> {
        let _ = (location, run, how);
        Ok(false)
    }

    /// Why damaging a stored row cannot apply to this backend at all (the memory store keeps
    /// decoded events, no rows), if so: the corruption case is then [`Skip::NotApplicable`].
    /// `None` (the default): the backend has rows, and [`corrupt`](Self::corrupt) must damage
    /// them.
    fn corrupt_not_applicable(&self) -> Option<&'static str> {
        None
    }
}

/// Why a case did not run. A case skips by [`skip`], and the runners report it as skipped,
/// never as passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The case cannot apply to this backend, as its factory declared (with the reason): not a
    /// failure.
    NotApplicable(String),
    /// The factory lacks what the case needs though the backend could give it: the generated
    /// test fails.
    Missing(String),
}

/// Ends the running case as skipped for `why`. Unwinds (without the panic hook's message), so
/// it can be called anywhere in a case; [`run_case`] and the generated tests catch it.
pub fn skip(why: Skip) -> ! {
    std::panic::resume_unwind(Box::new(why))
}

/// How [`StoreFactory::corrupt`] damages a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// Cut the row's body short (a torn write).
    Truncated,
    /// Replace the body with bytes that are not JSON.
    Garbage,
    /// Mark the row with a newer format version than this build reads (9999).
    UnknownVersion,
}

/// What a factory expression given to [`store_suite!`] may yield: a factory, or `None` to skip.
pub trait FactorySource {
    /// The factory, or why the cases are skipped.
    ///
    /// # Errors
    /// The reason to print in the `skipped:` line.
    fn into_factory(self) -> Result<Arc<dyn StoreFactory>, String>;
}

impl<F: StoreFactory> FactorySource for F {
    fn into_factory(self) -> Result<Arc<dyn StoreFactory>, String> {
        Ok(Arc::new(self))
    }
}

impl<F: StoreFactory> FactorySource for Option<F> {
    fn into_factory(self) -> Result<Arc<dyn StoreFactory>, String> {
        self.map(|f| Arc::new(f) as Arc<dyn StoreFactory>)
            .ok_or_else(|| "the factory expression gave None".to_owned())
    }
}

/// How many random sequences the model-based test runs: `EVE_CONFORMANCE_CASES`, else
/// [`DEEP_CASES`] under `EVE_CONFORMANCE_DEEP=1`, else [`DEFAULT_CASES`].
///
/// # Panics
/// When `EVE_CONFORMANCE_CASES` is set but is not a number (a typo should not silently run the
/// default).
pub fn case_count() -> u32 {
    if let Ok(v) = std::env::var("EVE_CONFORMANCE_CASES") {
        return v.trim().parse().unwrap_or_else(|_| {
            panic!("EVE_CONFORMANCE_CASES={v:?} is not a number; set it to a case count like 32")
        });
    }
    match std::env::var("EVE_CONFORMANCE_DEEP").as_deref() {
        Ok("1") | Ok("true") | Ok("yes") => DEEP_CASES,
        _ => DEFAULT_CASES,
    }
}

/// One store case: an async fn taking the factory and panicking on failure.
pub type StoreCase = for<'a> fn(&'a dyn StoreFactory) -> BoxFuture<'a, ()>;

/// Every store-level case, by name (`family::case`). [`store_suite!`] and [`run_store_suite`]
/// both expand from the same list.
pub fn store_cases() -> &'static [(&'static str, StoreCase)] {
    __store_cases!(table)
}

/// Every engine-level case (one per fault family), by name (`engine::family`).
/// [`store_suite!`] and [`run_engine_suite`] both expand from the same list.
pub fn engine_cases() -> &'static [(&'static str, StoreCase)] {
    __engine_cases!(table)
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseOutcome {
    /// Passed.
    Passed,
    /// Did not run, and why (see [`Skip`]).
    Skipped(Skip),
    /// Panicked with this message.
    Failed(String),
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// `family::case`.
    pub name: &'static str,
    /// How it ended.
    pub outcome: CaseOutcome,
    /// How long it took.
    pub elapsed: Duration,
}

/// What [`run_store_suite`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every case, in suite order.
    pub cases: Vec<CaseResult>,
}

impl Report {
    /// Whether every case passed or was declared not applicable to the backend (no case
    /// failed, none skipped for a missing factory capability).
    pub fn passed(&self) -> bool {
        self.cases.iter().all(|c| {
            matches!(
                c.outcome,
                CaseOutcome::Passed | CaseOutcome::Skipped(Skip::NotApplicable(_))
            )
        })
    }

    /// How many cases passed, were skipped and failed.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count =
            |f: fn(&CaseOutcome) -> bool| self.cases.iter().filter(|c| f(&c.outcome)).count();
        (
            count(|o| matches!(o, CaseOutcome::Passed)),
            count(|o| matches!(o, CaseOutcome::Skipped(_))),
            count(|o| matches!(o, CaseOutcome::Failed(_))),
        )
    }

    /// The failed cases.
    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases
            .iter()
            .filter(|c| matches!(c.outcome, CaseOutcome::Failed(_)))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cases {
            writeln!(f, "{}", c)?;
        }
        let (passed, skipped, failed) = self.counts();
        write!(
            f,
            "{} cases: {passed} passed, {skipped} skipped, {failed} failed",
            self.cases.len()
        )
    }
}

impl fmt::Display for CaseResult {
    /// One line: `ok`, `skip` (with why) or `FAILED` (with the message on one line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, t) = (self.name, self.elapsed);
        match &self.outcome {
            CaseOutcome::Passed => write!(f, "ok     {name} ({t:.2?})"),
            CaseOutcome::Skipped(Skip::NotApplicable(why)) => {
                write!(f, "skip   {name}: not applicable: {why}")
            }
            CaseOutcome::Skipped(Skip::Missing(why)) => write!(f, "skip   {name}: MISSING: {why}"),
            CaseOutcome::Failed(m) => {
                write!(f, "FAILED {name} ({t:.2?}): {}", m.replace('\n', " / "))
            }
        }
    }
}

/// Runs every store case against `factory`, one after another, catching each case's panic.
/// Cases that need [`StoreFactory::open`] pass with a printed note when it gives `None`.
///
/// Must run on a multi-thread tokio runtime (the concurrency cases spawn tasks).
pub async fn run_store_suite(factory: &dyn StoreFactory) -> Report {
    run_cases(factory, store_cases()).await
}

/// Runs every engine case (see [`engine`]) against `factory`, one after another, catching each
/// case's panic. Each case runs [`engine::engine_case_count`] programs on one fresh store.
///
/// Must run on a multi-thread tokio runtime.
pub async fn run_engine_suite(factory: &dyn StoreFactory) -> Report {
    run_cases(factory, engine_cases()).await
}

async fn run_cases(factory: &dyn StoreFactory, cases: &[(&'static str, StoreCase)]) -> Report {
    let mut report = Report::default();
    for (name, case) in cases {
        report.cases.push(run_case(factory, name, *case).await);
    }
    report
}

/// Runs one case against `factory`, catching its panic (a failure) or its [`skip`].
pub async fn run_case(
    factory: &dyn StoreFactory,
    name: &'static str,
    case: StoreCase,
) -> CaseResult {
    let start = Instant::now();
    let outcome = match AssertUnwindSafe(case(factory)).catch_unwind().await {
        Ok(()) => CaseOutcome::Passed,
        Err(panic) => match panic.downcast::<Skip>() {
            Ok(skip) => CaseOutcome::Skipped(*skip),
            Err(panic) => CaseOutcome::Failed(panic_message(&*panic)),
        },
    };
    CaseResult {
        name,
        outcome,
        elapsed: start.elapsed(),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked with a non-string payload".to_owned()
    }
}

/// Support for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use futures::future::BoxFuture;

    /// Runs `fut` on the runtime `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`
    /// builds.
    pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build the tokio runtime for a conformance case")
            .block_on(fut)
    }

    /// Prints `skipped: <case>: <why>` straight to stderr, past the test harness's output
    /// capture, so plain `cargo test` shows what did not run.
    pub fn skipped(case: &str, why: &str) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: {case}: {why}");
    }

    /// Runs a generated test's case: a [`Skip::NotApplicable`](crate::Skip) prints a
    /// `skipped:` line and passes; a [`Skip::Missing`](crate::Skip) prints it and fails the
    /// test; a failure panics on as it was.
    pub async fn run_generated(name: &str, case: impl std::future::Future<Output = ()>) {
        use futures::FutureExt;
        if let Err(panic) = std::panic::AssertUnwindSafe(case).catch_unwind().await {
            match panic.downcast::<crate::Skip>() {
                Ok(skip) => match *skip {
                    crate::Skip::NotApplicable(why) => {
                        skipped(name, &format!("not applicable to this backend: {why}"))
                    }
                    crate::Skip::Missing(why) => {
                        skipped(name, &why);
                        panic!("{name} was skipped but should run on this backend: {why}")
                    }
                },
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    /// Whether `var` is set and non-empty.
    pub fn env_set(var: &str) -> bool {
        std::env::var(var).is_ok_and(|v| !v.is_empty())
    }
}

/// Expands every store-level conformance case, and every engine-level case (one per fault
/// family, named `engine_<family>`, see [`engine`]), into a named `#[test]` in the calling crate.
///
/// Forms:
/// - `store_suite!(factory_expr)`: the expression yields a [`StoreFactory`] or an `Option` of one
///   (see [`FactorySource`]); `None` skips with a printed `skipped:` line.
/// - `store_suite!(skip_unless = "ENV_VAR", factory_expr)`: when `ENV_VAR` is unset or empty,
///   every case prints `skipped: <case>: ENV_VAR is unset` and passes without evaluating the
///   expression. When it is set, a server that does not answer fails the cases.
///
/// The expression is evaluated once per case, inside the async test, so it may `.await`.
/// The tests are named after the cases (`concurrent_appends_one_winner`, …): give the macro call
/// its own test file or module.
#[macro_export]
macro_rules! store_suite {
    (skip_unless = $var:literal, $factory:expr $(,)?) => {
        $crate::__store_cases!(tests { Some($var) } { $factory });
        $crate::__engine_cases!(tests { Some($var) } { $factory });
    };
    ($factory:expr $(,)?) => {
        $crate::__store_cases!(tests { None::<&str> } { $factory });
        $crate::__engine_cases!(tests { None::<&str> } { $factory });
    };
}

/// The one list of engine cases (fault families). `table` gives [`engine_cases`]; `tests`
/// expands them as tests named `engine_<family>`.
#[doc(hidden)]
#[macro_export]
macro_rules! __engine_cases {
    ($mode:ident $($args:tt)*) => {
        $crate::__engine_cases! { @expand $mode { $($args)* } [
            engine_no_faults = no_faults,
            engine_crash = crash,
            engine_ambiguous_commit = ambiguous_commit,
            engine_duplicate_deliveries = duplicate_deliveries,
            engine_duplicate_dispatch = duplicate_dispatch,
            engine_racing_workers = racing_workers,
            engine_lease_expiry = lease_expiry,
            engine_non_determinism = non_determinism,
            engine_cancel = cancel,
            engine_local_batch_crash = local_batch_crash,
        ] }
    };
    (@expand table {} [$($test:ident = $case:ident),* $(,)?]) => {
        &[$(
            (concat!("engine::", stringify!($case)), {
                fn case<'a>(
                    f: &'a dyn $crate::StoreFactory,
                ) -> $crate::__private::BoxFuture<'a, ()> {
                    ::std::boxed::Box::pin($crate::engine::$case(f))
                }
                case as $crate::StoreCase
            }),
        )*]
    };
    (@expand tests { { $skip:expr } { $factory:expr } } [$($test:ident = $case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $test() {
                $crate::__private::block_on(async {
                    let name = concat!("engine::", stringify!($case));
                    let skip: ::std::option::Option<&str> = $skip;
                    if let ::std::option::Option::Some(var) = skip {
                        if !$crate::__private::env_set(var) {
                            $crate::__private::skipped(name, &format!("{var} is unset; set it to run this case against a real server"));
                            return;
                        }
                    }
                    match $crate::FactorySource::into_factory($factory) {
                        ::std::result::Result::Ok(factory) => {
                            $crate::__private::run_generated(name, $crate::engine::$case(&*factory)).await
                        }
                        ::std::result::Result::Err(why) => $crate::__private::skipped(name, &why),
                    }
                })
            }
        )*
    };
}

/// The one list of store cases. `table` gives [`store_cases`]; `tests` expands them as tests.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_cases {
    ($mode:ident $($args:tt)*) => {
        $crate::__store_cases! { @expand $mode { $($args)* } [
            appends::concurrent_appends_one_winner,
            appends::append_is_all_or_nothing,
            appends::retry_of_landed_append_is_duplicate,
            appends::append_to_ended_run_refused,
            starts::create_run_is_idempotent,
            starts::concurrent_create_run_one_run,
            starts::same_key_different_input_mismatch,
            deliveries::concurrent_hook_dedupe_one_event,
            deliveries::concurrent_answers_one_answered,
            deliveries::answer_semantics,
            deliveries::deliveries_to_ended_run_refused,
            deliveries::cancel_request_once,
            deliveries::cancel_withdraws_pending_requests_atomically,
            deliveries::answer_racing_cancel_kept_or_withdrawn,
            deliveries::approval_answer_is_final,
            hooks::hook_token_unique_and_released,
            hooks::concurrent_hook_registration_one_winner,
            hooks::token_repeated_in_one_append,
            leases::two_claimers_one_holder,
            leases::expired_lease_is_fenced_and_forks_nothing,
            leases::reregister_bumps_epoch_and_fences,
            leases::heartbeat_and_retire,
            leases::orphaned_runs_are_claimable_at_once,
            leases::orphans_and_due_work_in_claim_key_order,
            leases::eager_start_claims_the_new_run,
            leases::one_live_holder_per_worker_id,
            wakeups::due_order_and_not_yet_due,
            wakeups::nothing_due_left_unclaimed,
            wakeups::processed_seq_and_release,
            reads::large_payload_round_trips,
            reads::ten_thousand_events_page_in_order,
            reads::payload_bytes_are_kept_exactly,
            limits::append_limits_are_typed_errors,
            limits::read_limits_are_typed_errors,
            limits::empty_keys_are_invalid,
            limits::corrupt_rows_are_typed_errors,
            persistence::everything_survives_reopen,
            persistence::two_handles_share_one_store,
            isolation::stores_never_see_each_other,
            sessions::session_log_in_order,
            sessions::queries_by_session_and_status,
            sessions::list_runs_ties_by_run_id,
            sessions::agent_request_answered_once,
            sessions::approval_request_and_denial,
            turns::ended_session_refuses_new_runs,
            turns::end_racing_starts_lists_every_run,
            turns::queued_messages_taken_once_in_order,
            turns::concurrent_takes_split_messages,
            turns::end_lists_blocked_runs_live,
            turns::overlapping_takes_hand_each_message_once,
            blocked::resolve_blocked_resume_and_fail,
            blocked::cancel_ends_a_blocked_run,
            blocked::terminate_ends_any_live_run,
            resets::reset_copies_prefix_idempotently,
            resets::retry_cuts_at_the_failed_step,
            resets::claimed_start_is_held_until_retired,
            search::attributes_are_indexed_and_searchable,
            keys::keys_create_find_list,
            keys::keys_revoke_once_and_persist,
            keys::keys_keep_their_expiry,
            keys::keys_keep_their_limits,
            retention::purge_removes_only_runs_ended_before_cutoff,
            retention::purge_is_bounded_and_idempotent,
            retention::concurrent_purges_count_each_run_once,
            retention::keyed_delivery_retained_until_purge,
            retention::sessions_outlive_purge,
            clauses::answer_to_withdrawn_request_of_running_run,
            clauses::hook_dedupe_key_belongs_to_one_hook,
            clauses::reads_in_seq_order_when_clocks_go_back,
            clauses::hook_token_released_at_every_end,
            clauses::older_epoch_fenced_after_reclaim,
            clauses::cancel_after_end_is_already_ended,
            clauses::retry_of_older_append_is_duplicate,
            clauses::claims_honour_time_to_the_millisecond,
            clauses::refused_append_mode_match_and_due_wake,
            clauses::fencing_tokens_grow_with_every_claim,
            sequences::random_sequences_match_model,
        ] }
    };
    (@expand table {} [$($family:ident :: $case:ident),* $(,)?]) => {
        &[$(
            (concat!(stringify!($family), "::", stringify!($case)), {
                fn case<'a>(
                    f: &'a dyn $crate::StoreFactory,
                ) -> $crate::__private::BoxFuture<'a, ()> {
                    ::std::boxed::Box::pin($crate::store::$family::$case(f))
                }
                case as $crate::StoreCase
            }),
        )*]
    };
    (@expand tests { { $skip:expr } { $factory:expr } } [$($family:ident :: $case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                $crate::__private::block_on(async {
                    let name = concat!(stringify!($family), "::", stringify!($case));
                    let skip: ::std::option::Option<&str> = $skip;
                    if let ::std::option::Option::Some(var) = skip {
                        if !$crate::__private::env_set(var) {
                            $crate::__private::skipped(name, &format!("{var} is unset; set it to run this case against a real server"));
                            return;
                        }
                    }
                    match $crate::FactorySource::into_factory($factory) {
                        ::std::result::Result::Ok(factory) => {
                            $crate::__private::run_generated(name, $crate::store::$family::$case(&*factory)).await
                        }
                        ::std::result::Result::Err(why) => $crate::__private::skipped(name, &why),
                    }
                })
            }
        )*
    };
}
