//! The `eve` command serving the seed's example tools: the examples' app, built with
//! [`eve::App`] as any user's own `eve` is (`examples/app/` is the one to copy).

fn main() -> std::process::ExitCode {
    eve::App::from_registry(eve_examples::registry()).run()
}
