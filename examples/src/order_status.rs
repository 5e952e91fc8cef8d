//! An ordinary tool (`#[tool]`): no durable operations, so a call runs inline and answers at
//! once, with no run and no journal (`POST /v1/tools/order_status/calls` answers `{"run":
//! null, "settled": …}`; over MCP a plain `tools/call` result).

use eve::prelude::*;
use serde::{Deserialize, Serialize};

/// The tool input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Input {
    /// The order to look up (`o-…`).
    pub order_id: String,
}

/// What the shop says about an order.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// The order.
    pub order_id: String,
    /// `shipped`, `packing` or `delivered`.
    pub status: String,
}

/// The order's status in the example shop: every order exists but `o-missing`, and its status
/// follows from its id, so every call answers the same.
pub fn lookup(order_id: &str) -> Option<Status> {
    if order_id == "o-missing" {
        return None;
    }
    let status = match order_id.bytes().map(u32::from).sum::<u32>() % 3 {
        0 => "packing",
        1 => "shipped",
        _ => "delivered",
    };
    Some(Status {
        order_id: order_id.to_owned(),
        status: status.to_owned(),
    })
}

/// Look an order's status up in the shop. Answers at once.
#[tool]
pub async fn order_status(_ctx: ToolCtx, input: Input) -> Result<Status, WorkflowError> {
    lookup(&input.order_id)
        .ok_or_else(|| WorkflowError::new(format!("no order {} in the shop", input.order_id)))
}
