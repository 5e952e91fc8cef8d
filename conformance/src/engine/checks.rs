//! The properties every program × schedule must satisfy, each as a function returning what
//! broke.

use super::interp::Instance;
use super::program::digest;
use super::reference::{Attempt, Await, Command, End, Expected};
use eve_core::engine::{Registry, Worker, GRACE_CMD, GUARD_CMD};
use eve_core::{
    Event, JournalStore, Payload, RunId, RunRecord, RunStatus, StoreError, StoredEvent, Timestamp,
};
use std::collections::BTreeMap;
use std::sync::Arc;

fn internal(cmd: u64) -> bool {
    cmd == GUARD_CMD || cmd == GRACE_CMD
}

fn value(p: &Payload) -> Result<serde_json::Value, String> {
    p.to_value()
        .map_err(|e| format!("a recorded payload is not JSON: {e}"))
}

/// The commands with a command event in the journal (their kind and name are recorded).
pub fn recorded_commands(events: &[StoredEvent]) -> Vec<u64> {
    let mut cmds: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepCompleted { cmd, .. }
            | Event::StepFailed { cmd, .. }
            | Event::SleepScheduled { cmd, .. }
            | Event::HookCreated { cmd, .. }
            | Event::InputRequested { cmd, .. }
            | Event::Progress { cmd, .. }
            | Event::MessagePosted { cmd, .. }
            | Event::Patched { cmd, .. } => Some(*cmd),
            _ => None,
        })
        .filter(|c| !internal(*c))
        .collect();
    cmds.sort_unstable();
    cmds.dedup();
    cmds
}

/// What the body waits on at a park is durable: its sleep is scheduled and has not fired, its
/// hook is created and every payload delivered to it was consumed.
///
/// # Errors
/// What is missing.
pub fn waits_recorded(a: &Await, events: &[StoredEvent], inst: &Instance) -> Result<(), String> {
    let scheduled = |c: u64| {
        events
            .iter()
            .any(|e| matches!(&e.event, Event::SleepScheduled { cmd, .. } if *cmd == c))
    };
    let fired = |c: u64| {
        events
            .iter()
            .any(|e| matches!(&e.event, Event::SleepFired { cmd } if *cmd == c))
    };
    let created = |c: u64, t: &str| {
        events.iter().any(
            |e| matches!(&e.event, Event::HookCreated { cmd, token, .. } if *cmd == c && *token == inst.token(t)),
        )
    };
    let received = |c: u64| {
        events
            .iter()
            .filter(|e| matches!(&e.event, Event::HookReceived { cmd, .. } if *cmd == c))
            .count()
    };
    let requested = |c: u64| {
        events.iter().find_map(|e| match &e.event {
            Event::InputRequested {
                cmd, request_id, ..
            } if *cmd == c => Some(request_id.clone()),
            _ => None,
        })
    };
    let open = |c: u64| {
        match requested(c) {
        None => Err(format!(
            "the run suspended on the ask of command {c} but its InputRequested is not in the journal"
        )),
        Some(r) => {
            let closed = events.iter().any(|e| {
                matches!(&e.event, Event::InputAnswered { request_id, .. } | Event::InputWithdrawn { request_id } if *request_id == r)
            });
            if closed {
                Err(format!("parked on request {r}, which is answered or withdrawn already"))
            } else {
                Ok(())
            }
        }
    }
    };
    match a {
        Await::Steps(_) | Await::Agent { .. } => Ok(()),
        Await::Ask { cmd, .. } => open(*cmd),
        Await::RaceAsk { ask, sleep, .. } => {
            open(*ask)?;
            if !scheduled(*sleep) || fired(*sleep) {
                return Err(format!(
                    "the race's sleep (command {sleep}) must be scheduled and not fired"
                ));
            }
            Ok(())
        }
        Await::Sleep { cmd } if !scheduled(*cmd) || fired(*cmd) => Err(format!(
            "the sleep of command {cmd} must be scheduled and not fired"
        )),
        Await::Sleep { .. } => Ok(()),
        Await::Hook {
            cmd,
            token,
            consumed,
            ..
        } => {
            if !created(*cmd, token) {
                return Err(format!(
                    "the run suspended on hook {token} but its HookCreated (command {cmd}) is not in the journal"
                ));
            }
            let n = received(*cmd);
            if n != *consumed {
                return Err(format!(
                    "parked on hook {token} after consuming {consumed} payload(s), but the journal holds {n}"
                ));
            }
            Ok(())
        }
        Await::Race {
            hook, sleep, token, ..
        } => {
            if !created(*hook, token) || received(*hook) != 0 {
                return Err(format!(
                    "the race's hook {token} (command {hook}) must be created and have no payload"
                ));
            }
            if !scheduled(*sleep) || fired(*sleep) {
                return Err(format!(
                    "the race's sleep (command {sleep}) must be scheduled and not fired"
                ));
            }
            Ok(())
        }
    }
}

/// The run ended as the reference says: status, output or error, and one terminal event, last.
///
/// # Errors
/// The difference.
pub fn end(exp: &Expected, rec: &RunRecord, events: &[StoredEvent]) -> Result<(), String> {
    let terminal: Vec<&StoredEvent> = events
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::RunCompleted { .. } | Event::RunFailed { .. } | Event::RunCancelled
            )
        })
        .collect();
    if terminal.len() != 1 || terminal[0].seq + 1 != events.len() as u64 {
        return Err(format!(
            "the journal must end with exactly one terminal event; found {} (status {})",
            terminal.len(),
            rec.status.as_str()
        ));
    }
    match (&exp.end, &terminal[0].event) {
        (End::Completed(want), Event::RunCompleted { output }) => {
            let got = value(output)?;
            if &got != want {
                return Err(format!(
                    "the run completed with another output than the reference:\n  got  {got}\n  want {want}"
                ));
            }
        }
        (End::Failed(want), Event::RunFailed { error }) if error == want => {}
        (End::Cancelled, Event::RunCancelled) => {}
        (want, got) => {
            return Err(format!(
                "the run ended with {got:?}; the reference ends with {want:?}"
            ))
        }
    }
    let want = match exp.end {
        End::Completed(_) => RunStatus::Completed,
        End::Failed(_) => RunStatus::Failed,
        End::Cancelled => RunStatus::Cancelled,
    };
    if rec.status != want {
        return Err(format!(
            "the journal ends the run but its status is {}, not {}",
            rec.status.as_str(),
            want.as_str()
        ));
    }
    Ok(())
}

/// The journal holds the reference's commands and nothing else: each step's attempts exactly as
/// the reference (so each completed step's result recorded exactly once), each wait scheduled
/// or created once, each hook's payloads as delivered.
///
/// # Errors
/// The first difference.
pub fn journal(exp: &Expected, events: &[StoredEvent], inst: &Instance) -> Result<(), String> {
    let mut steps: BTreeMap<u64, Vec<(u32, Attempt)>> = BTreeMap::new();
    let mut sleeps: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
    let mut hooks: BTreeMap<u64, (u32, usize)> = BTreeMap::new();
    let mut requests: BTreeMap<eve_core::RequestId, u64> = BTreeMap::new();
    let mut closed: BTreeMap<u64, Result<String, ()>> = BTreeMap::new();
    let mut progress: BTreeMap<u64, u32> = BTreeMap::new();
    let mut agents: BTreeMap<u64, u32> = BTreeMap::new();
    let command = |cmd: u64, what: &str, ok: &dyn Fn(&Command) -> bool| match exp
        .commands
        .get(cmd as usize)
    {
        Some(c) if ok(c) => Ok(()),
        other => Err(format!(
            "the journal records {what} at command {cmd}; the reference issues {other:?} there"
        )),
    };
    for (i, e) in events.iter().enumerate() {
        if e.seq != i as u64 {
            return Err(format!("event {i} has seq {}", e.seq));
        }
        match &e.event {
            Event::RunStarted { .. } if i != 0 => {
                return Err(format!("a second RunStarted at seq {i}"))
            }
            Event::StepCompleted {
                cmd,
                name,
                attempt,
                output,
            } => {
                command(
                    *cmd,
                    &format!("step {name:?}"),
                    &|c| matches!(c, Command::Step(n) if n == name),
                )?;
                steps
                    .entry(*cmd)
                    .or_default()
                    .push((*attempt, Attempt::Completed(digest(&value(output)?))));
            }
            Event::StepFailed {
                cmd,
                name,
                attempt,
                fatal,
                retry_at,
                ..
            } => {
                command(
                    *cmd,
                    &format!("step {name:?}"),
                    &|c| matches!(c, Command::Step(n) if n == name),
                )?;
                steps.entry(*cmd).or_default().push((
                    *attempt,
                    Attempt::Failed {
                        fatal: *fatal,
                        retried: retry_at.is_some(),
                    },
                ));
            }
            Event::SleepScheduled { cmd, .. } if !internal(*cmd) => {
                command(*cmd, "a sleep", &|c| matches!(c, Command::Sleep))?;
                sleeps.entry(*cmd).or_default().0 += 1;
            }
            Event::SleepFired { cmd } if !internal(*cmd) => {
                let s = sleeps.entry(*cmd).or_default();
                if s.0 == 0 {
                    return Err(format!(
                        "SleepFired for command {cmd} before its SleepScheduled"
                    ));
                }
                s.1 += 1;
            }
            Event::HookCreated { cmd, token, .. } => {
                command(*cmd, &format!("hook {token:?}"), &|c| match c {
                    Command::Hook(t) => inst.token(t) == *token,
                    Command::Agent(k) => {
                        token.starts_with("agent:") && token.ends_with(&format!(":{k}"))
                    }
                    _ => false,
                })?;
                hooks.entry(*cmd).or_default().0 += 1;
            }
            Event::MessagePosted { cmd, message } => {
                let d = digest(&value(message)?);
                command(
                    *cmd,
                    &format!("message {d}"),
                    &|c| matches!(c, Command::Message(x) if *x == d),
                )?;
                *progress.entry(*cmd).or_default() += 1;
            }
            Event::AgentStarted { cmd, key, .. } => {
                command(
                    *cmd,
                    &format!("agent {key:?} started"),
                    &|c| matches!(c, Command::Agent(k) if k == key),
                )?;
                *agents.entry(*cmd).or_default() += 1;
            }
            Event::HookReceived { cmd, .. } => {
                let h = hooks.entry(*cmd).or_default();
                if h.0 == 0 {
                    return Err(format!(
                        "HookReceived for command {cmd} before its HookCreated"
                    ));
                }
                h.1 += 1;
            }
            Event::InputRequested {
                cmd, request_id, ..
            } => {
                command(*cmd, "an ask", &|c| matches!(c, Command::Ask))?;
                if requests.insert(request_id.clone(), *cmd).is_some() {
                    return Err(format!("request {request_id} is requested twice"));
                }
            }
            Event::InputAnswered {
                request_id,
                response,
            } => {
                let cmd = *requests.get(request_id).ok_or_else(|| {
                    format!("an answer to {request_id}, which was never requested")
                })?;
                if closed
                    .insert(cmd, Ok(response.text.clone().unwrap_or_default()))
                    .is_some()
                {
                    return Err(format!(
                        "request {request_id} is answered or withdrawn twice"
                    ));
                }
            }
            Event::InputWithdrawn { request_id } => {
                let cmd = *requests
                    .get(request_id)
                    .ok_or_else(|| format!("{request_id} is withdrawn but was never requested"))?;
                if closed.insert(cmd, Err(())).is_some() {
                    return Err(format!(
                        "request {request_id} is answered or withdrawn twice"
                    ));
                }
            }
            Event::Progress { cmd, value: v } => {
                let d = digest(&value(v)?);
                command(
                    *cmd,
                    &format!("progress {d}"),
                    &|c| matches!(c, Command::Progress(x) if *x == d),
                )?;
                *progress.entry(*cmd).or_default() += 1;
            }
            _ => {}
        }
    }
    for r in &exp.steps {
        let got = steps.remove(&r.cmd).unwrap_or_default();
        let want: Vec<(u32, Attempt)> = r
            .attempts
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u32 + 1, a.clone()))
            .collect();
        if got != want {
            return Err(format!(
                "step {:?} (command {}): the journal records attempts {got:?}; the reference records {want:?} (each attempt and each result exactly once)",
                r.name, r.cmd
            ));
        }
    }
    if let Some((cmd, got)) = steps.into_iter().next() {
        return Err(format!(
            "the journal records attempts {got:?} for command {cmd}, a step the reference never runs"
        ));
    }
    for (cmd, c) in exp.commands.iter().enumerate() {
        let cmd = cmd as u64;
        match c {
            Command::Sleep => {
                let (s, f) = sleeps.get(&cmd).copied().unwrap_or_default();
                if s != 1 || f > 1 {
                    return Err(format!(
                        "the sleep of command {cmd} is scheduled {s} and fired {f} time(s); once and at most once"
                    ));
                }
            }
            Command::Agent(k) => {
                let (created, received) = hooks.get(&cmd).copied().unwrap_or_default();
                let started = agents.get(&cmd).copied().unwrap_or(0);
                if created != 1 || received != 1 || started > 1 {
                    return Err(format!(
                        "agent call {k} (command {cmd}): intent recorded {created} time(s), result {received} time(s), start {started} time(s); once, once, at most once"
                    ));
                }
            }
            Command::Hook(t) => {
                let (created, received) = hooks.get(&cmd).copied().unwrap_or_default();
                let want = exp.received(t);
                if created != 1 || received != want {
                    return Err(format!(
                        "hook {t} (command {cmd}) is created {created} time(s) and received {received} payload(s); the reference: once, {want}"
                    ));
                }
            }
            Command::Ask => {
                let want = exp
                    .answers
                    .iter()
                    .find(|a| a.cmd == cmd)
                    .map(|a| a.text.clone());
                let got = closed.get(&cmd);
                let ok = match (&want, got) {
                    (Some(w), Some(Ok(t))) => w == t,
                    (None, Some(Err(()))) => true,
                    _ => false,
                };
                if !ok {
                    return Err(format!(
                        "the ask of command {cmd} ended {got:?}; the reference: {} (every request is answered at most once, and withdrawn when the run ends unanswered)",
                        match &want {
                            Some(w) => format!("answered {w:?}"),
                            None => "withdrawn".into(),
                        }
                    ));
                }
            }
            Command::Progress(_) | Command::Message(_) => {
                let n = progress.get(&cmd).copied().unwrap_or(0);
                if n != 1 {
                    return Err(format!(
                        "the progress value of command {cmd} is recorded {n} time(s); exactly once"
                    ));
                }
            }
            Command::Step(_) => {}
        }
    }
    Ok(())
}

/// Once the run ended, no request of its session is pending and a withdrawn request takes no
/// answer.
///
/// # Errors
/// What is still open.
pub async fn requests_closed(
    store: &dyn JournalStore,
    session: &eve_core::SessionId,
    events: &[StoredEvent],
    now: Timestamp,
) -> Result<(), String> {
    let pending = store
        .pending_requests(session)
        .await
        .map_err(|e| format!("pending_requests: {e}"))?;
    if !pending.is_empty() {
        return Err(format!(
            "the run ended but requests are still pending: {pending:?}"
        ));
    }
    for e in events {
        if let Event::InputWithdrawn { request_id } = &e.event {
            let late = eve_core::InputResponse::text("too late");
            match store.answer(request_id, late, now).await {
                Err(StoreError::Withdrawn { .. }) => {}
                other => {
                    return Err(format!(
                        "an answer to withdrawn request {request_id} must be refused with Withdrawn; got {other:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

/// No step executed after its outcome was recorded unless a fencing service would refuse it
/// (its [`fencing_token`](eve_core::engine::StepCtx::fencing_token) was below one a later
/// activation had shown: a worker whose lease lapsed, see [`lease_expiry`](super::lease_expiry));
/// every attempt the reference makes was executed at least once (steps are at-least-once: an
/// attempt whose result was lost in a crash runs again) and, with `exact` (no faults), exactly
/// once; nothing else executed. Returns the late executions that were fenced.
///
/// # Errors
/// The first difference.
pub fn executions(exp: &Expected, inst: &Instance, exact: bool) -> Result<usize, String> {
    let late = inst.violations();
    if !late.is_empty() {
        let late: Vec<String> = late
            .into_iter()
            .map(|(tag, v)| match tag {
                Some(t) => format!("{v} (by {t})"),
                None => v,
            })
            .collect();
        return Err(format!(
            "a step ran again after its result was recorded, with a fencing token no smaller than any shown before: {}",
            late.join("; ")
        ));
    }
    let ex = inst.executions();
    for r in &exp.steps {
        for a in 1..=r.attempts.len() as u32 {
            let n = ex.get(&(r.name.clone(), a)).copied().unwrap_or(0);
            if n == 0 || (exact && n != 1) {
                return Err(format!(
                    "step {:?} attempt {a} executed {n} time(s); {}",
                    r.name,
                    if exact {
                        "exactly once without faults"
                    } else {
                        "at least once"
                    }
                ));
            }
        }
    }
    for ((name, a), n) in &ex {
        if exp
            .step(name)
            .is_none_or(|r| *a as usize > r.attempts.len())
        {
            return Err(format!(
                "step {name:?} attempt {a} executed {n} time(s), but the reference never runs it"
            ));
        }
    }
    Ok(inst.fenced().len())
}

/// The run parked where the reference parks: exactly (`exact`), or at a subsequence that keeps
/// every park waiting for a delivery (a clock moved past a lease may fire a short sleep first).
///
/// # Errors
/// The difference.
pub fn parks(exp: &Expected, observed: &[usize], exact: bool) -> Result<(), String> {
    if exact {
        if observed != exp.parks.as_slice() {
            return Err(format!(
                "the run parked at awaits {observed:?}; the reference parks at {:?}",
                exp.parks
            ));
        }
        return Ok(());
    }
    let mut it = exp.parks.iter();
    for p in observed {
        if !it.any(|q| q == p) {
            return Err(format!(
                "the run parked at awaits {observed:?}, not a subsequence of the reference's {:?}",
                exp.parks
            ));
        }
    }
    for p in &exp.parks {
        let needs_delivery = matches!(
            exp.awaits[*p],
            Await::Hook {
                delivery: Some(_),
                ..
            } | Await::Race {
                delivery: Some(_),
                ..
            }
        );
        if needs_delivery && !observed.contains(p) {
            return Err(format!(
                "the run never parked at await {p} ({:?}), where it waits for a delivery",
                exp.awaits[*p]
            ));
        }
    }
    Ok(())
}

/// A cold replay from the journal alone re-issues the reference's command sequence and ends
/// where the run ended.
///
/// # Errors
/// The difference, or the replay's error.
pub async fn replay(
    store: &Arc<dyn JournalStore>,
    reg: &Registry,
    run: &RunId,
    exp: &Expected,
    inst: &Instance,
    returns: bool,
) -> Result<(), String> {
    let before = inst.traces().len();
    let report = Worker::replay_cold(store, reg, run)
        .await
        .map_err(|e| format!("a cold replay of the journal failed: {e}"))?;
    let traces = inst.traces();
    let issued = traces
        .get(before)
        .ok_or("the cold replay did not run the body")?;
    if issued != &exp.commands {
        return Err(format!(
            "a cold replay issued commands {issued:?}; the reference issues {:?}",
            exp.commands
        ));
    }
    if report.commands != exp.commands.len() as u64 || report.finished != returns {
        return Err(format!(
            "a cold replay reports {report:?}; the reference issues {} commands and {}",
            exp.commands.len(),
            if returns {
                "returns"
            } else {
                "is left waiting (abandoned)"
            }
        ));
    }
    Ok(())
}

/// Once the run ended, its hooks take no more payloads.
///
/// # Errors
/// A delivery the store accepted.
pub async fn hooks_released(
    store: &dyn JournalStore,
    exp: &Expected,
    inst: &Instance,
    now: Timestamp,
) -> Result<(), String> {
    for c in &exp.commands {
        if let Command::Hook(t) = c {
            match store
                .deliver_hook(&inst.token(t), Payload::null(), Some("after-the-end"), now)
                .await
            {
                Err(StoreError::NotFound { .. } | StoreError::RunEnded { .. }) => {}
                other => {
                    return Err(format!(
                        "a delivery to hook {t} after its run ended must be refused (NotFound or RunEnded); got {other:?}"
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Nothing of a changed program ran or was recorded: no step or hook whose name the change
/// introduced (they end in `~`).
///
/// # Errors
/// What ran.
pub fn nothing_changed_ran(events: &[StoredEvent], inst: &Instance) -> Result<(), String> {
    for e in events {
        let named = match &e.event {
            Event::StepCompleted { name, .. } | Event::StepFailed { name, .. } => name,
            Event::HookCreated { token, .. } => token,
            _ => continue,
        };
        if named.ends_with('~') {
            return Err(format!(
                "the changed program's {named:?} reached the journal (seq {}) before non-determinism was detected",
                e.seq
            ));
        }
    }
    if let Some(((name, a), _)) = inst
        .executions()
        .iter()
        .find(|((n, _), _)| n.ends_with('~'))
    {
        return Err(format!(
            "the changed program's step {name:?} attempt {a} executed although replay must stop at the first mismatch"
        ));
    }
    Ok(())
}

/// After a crash inside a batch of local steps (held at the first execution of `held`):
/// without `landed` the batch's append failed, so `held` ran again (at least once for an
/// uncommitted outcome); with `landed` the append committed the batch before the crash, so no
/// attempt recorded up to `held`'s first outcome ran more than once (its outcome recorded
/// exactly once, never re-run). That each outcome is recorded exactly once is checked by
/// [`journal`] for every family.
///
/// # Errors
/// What broke.
pub fn local_batch_crash(
    events: &[StoredEvent],
    inst: &Instance,
    held: &str,
    landed: bool,
) -> Result<(), String> {
    let execs = inst.executions();
    let runs = |name: &str, attempt: u32| execs.get(&(name.to_owned(), attempt)).copied();
    let held_runs = runs(held, 1).unwrap_or(0);
    if !landed {
        if held_runs < 2 {
            return Err(format!(
                "local step {held} ran {held_runs} time(s): its batch's append failed in the crash, so it must run again"
            ));
        }
        return Ok(());
    }
    let outcome = |e: &StoredEvent| match &e.event {
        Event::StepCompleted { name, attempt, .. } | Event::StepFailed { name, attempt, .. } => {
            Some((name.clone(), *attempt))
        }
        _ => None,
    };
    let Some(at) = events
        .iter()
        .position(|e| outcome(e).is_some_and(|(n, a)| n == held && a == 1))
    else {
        return Err(format!(
            "local step {held}'s first attempt is not in the journal, though its batch's append landed"
        ));
    };
    for (name, attempt) in events[..=at].iter().filter_map(outcome) {
        if let Some(n) = runs(&name, attempt).filter(|n| *n != 1) {
            return Err(format!(
                "step {name} attempt {attempt} ran {n} times, though its outcome was committed (with the batch of local step {held}) before the crash"
            ));
        }
    }
    Ok(())
}
