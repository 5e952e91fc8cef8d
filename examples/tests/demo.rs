//! The README's main command: the reminder demo kills its worker process mid-step, starts a new
//! one, and the run finishes with each step's result recorded once.

#[test]
fn reminder_demo_survives_a_killed_worker() {
    let dir = std::env::temp_dir().join(format!("eve-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("demo.db");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reminder"))
        .args(["demo", "--db", db.to_str().unwrap()])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("killed worker process 1"), "{stdout}");
    assert!(stdout.contains("started worker process 2"), "{stdout}");
    assert!(
        stdout.contains(r#"steps recorded: ["prepare", "compose", "deliver"]"#),
        "{stdout}"
    );
    assert!(stdout.contains("RunCompleted"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
