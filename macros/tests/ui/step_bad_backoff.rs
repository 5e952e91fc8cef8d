// A step's backoff is checked at compile time.
use eve_core::engine::StepError;
use eve_macros::step;

#[step(retries = 5, backoff = "two seconds")]
async fn charge(order: String) -> Result<String, StepError> {
    Ok(order)
}

fn main() {}
