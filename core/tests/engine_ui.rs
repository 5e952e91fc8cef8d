//! Compile-fail tests: only a body marked as a workflow (taking `WorkflowCtx`) can become a
//! workflow tool, and ordinary tools' `ToolCtx` has no durable operations.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
