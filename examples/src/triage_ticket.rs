//! A workflow tool that labels its run with search attributes (`ctx.set_attributes`), so an
//! operator finds it later: `eve runs list --query 'attr.team = "billing" and attr.urgent =
//! true'`, or `GET /v1/runs?query=…`. The attributes are journaled (`AttributesSet`) and set
//! once: a replay writes nothing.

use eve::prelude::*;
use serde::Deserialize;

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The ticket's id.
    pub ticket_id: String,
    /// What the customer wrote.
    pub text: String,
}

/// The team a ticket goes to, and whether it is urgent, from its text.
pub fn classify(text: &str) -> (&'static str, bool) {
    let t = text.to_lowercase();
    let team = if ["refund", "invoice", "charge", "payment"]
        .iter()
        .any(|w| t.contains(w))
    {
        "billing"
    } else if ["error", "crash", "down", "bug"]
        .iter()
        .any(|w| t.contains(w))
    {
        "engineering"
    } else {
        "support"
    };
    let urgent = ["urgent", "asap", "down"].iter().any(|w| t.contains(w));
    (team, urgent)
}

/// Triage a support ticket: route it to a team and label the run with the team and urgency,
/// so the runs can be searched by them.
#[workflow(name = "triage_ticket")]
pub async fn execute(ctx: WorkflowCtx, input: Input) -> Result<serde_json::Value, WorkflowError> {
    let (team, urgent) = classify(&input.text);
    ctx.set_attributes(&serde_json::json!({
        "ticket": input.ticket_id,
        "team": team,
        "urgent": urgent,
    }))?;
    let queue = route_ticket(&ctx, input.ticket_id, team.to_owned()).await?;
    Ok(serde_json::json!({ "team": team, "urgent": urgent, "queue": queue }))
}

/// The `route_ticket` step: the queue the ticket landed in.
#[step]
pub async fn route_ticket(ticket_id: String, team: String) -> Result<String, StepError> {
    Ok(format!("{team}/{ticket_id}"))
}
