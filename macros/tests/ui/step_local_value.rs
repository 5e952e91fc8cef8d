// `local` is a flag on a step: `#[step(local)]`, not `local = true`.
use eve_core::engine::StepError;
use eve_macros::step;

#[step(local = true)]
async fn charge(order: String) -> Result<String, StepError> {
    Ok(order)
}

fn main() {}
