// A step must be an async fn.
use eve_core::engine::StepError;
use eve_macros::step;

#[step]
fn plan(service: String) -> Result<String, StepError> {
    Ok(service)
}

fn main() {}
