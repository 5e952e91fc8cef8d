//! `eve bench --compare … --quick` (issue 28): every workload's code path at tiny sizes on
//! SQLite, Postgres (`EVE_TEST_POSTGRES_URL`) and DynamoDB Local
//! (`EVE_TEST_DYNAMODB_ENDPOINT`), the servers skipped loudly when their variable is unset. A
//! smoke test, not a timed one: it checks that the JSON and the table have every figure for
//! every store, that the W2 child was really killed and recovered (the replay saw the
//! recorded steps), that no webhook failed, that storage grew, and that DynamoDB reported
//! consumed capacity — never how fast anything was.

mod common;

use common::*;

#[test]
fn bench_compare_quick_has_every_figure_for_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut urls = vec![format!("sqlite://{}", d.join("eve.db").display())];
    match std::env::var("EVE_TEST_POSTGRES_URL") {
        Ok(pg) => urls.push(pg),
        Err(_) => eprintln!(
            "skipped Postgres: EVE_TEST_POSTGRES_URL is unset; set it to bench a real server"
        ),
    }
    match std::env::var("EVE_TEST_DYNAMODB_ENDPOINT") {
        Ok(endpoint) => urls.push(format!("dynamodb://eve_bench?endpoint={endpoint}")),
        Err(_) => eprintln!(
            "skipped DynamoDB: EVE_TEST_DYNAMODB_ENDPOINT is unset; set it to bench DynamoDB Local"
        ),
    }
    let url_args: Vec<&str> = urls.iter().map(String::as_str).collect();
    let args = [&["bench", "--quick", "--json", "--compare"][..], &url_args].concat();
    let out = ok(d, &args);
    let json: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1, "{json}");
    let stores = json["stores"].as_array().unwrap();
    assert_eq!(stores.len(), urls.len(), "{json}");
    let common_keys = [
        "w1_1_calls_per_s",
        "w1_1_p50_ms",
        "w1_1_p99_ms",
        "w1_8_calls_per_s",
        "w1_8_p50_ms",
        "w1_8_p99_ms",
        "w2_total_ms",
        "w2_replay_ms",
        "w2_replayed_events",
        "w2_recover_ms",
        "w2_recover_inside_ms",
        "throughput_steps_per_s",
        "bytes_per_step",
        "webhook_p50_ms",
        "webhook_p99_ms",
        "webhook_errors",
        "parked_kib_per_run",
    ];
    let dynamo_keys = [
        "dynamodb_rcu_per_step",
        "dynamodb_wcu_per_step",
        "dynamodb_rcu_per_call",
        "dynamodb_wcu_per_call",
        "dynamodb_rcu_per_resume",
        "dynamodb_wcu_per_resume",
        "dynamodb_usd_per_million_steps",
        "dynamodb_unreported_answers",
    ];
    for (store, url) in stores.iter().zip(&urls) {
        assert_eq!(store["url"], url.as_str());
        let f = &store["figures"];
        let is_dynamo = url.starts_with("dynamodb://");
        for key in common_keys {
            assert!(f[key].is_number(), "{url}: {key} missing in {f}");
        }
        for key in dynamo_keys {
            assert_eq!(f[key].is_number(), is_dynamo, "{url}: {key} in {f}");
        }
        // W2's child was killed inside its last step (20 with --quick): the cold replay saw
        // the 19 recorded steps (and more events: the start, the schedules).
        assert!(f["w2_replayed_events"].as_f64().unwrap() >= 19.0, "{f}");
        assert_eq!(f["webhook_errors"].as_f64(), Some(0.0), "{url}: {f}");
        assert!(f["bytes_per_step"].as_f64().unwrap() > 0.0, "{url}: {f}");
        for key in ["w1_1_calls_per_s", "throughput_steps_per_s"] {
            assert!(f[key].as_f64().unwrap() > 0.0, "{url}: {key} {f}");
        }
        if is_dynamo {
            assert_eq!(store["label"], "dynamodb (Local)");
            // DynamoDB Local reports consumed capacity: every step wrote something.
            for key in [
                "dynamodb_wcu_per_step",
                "dynamodb_wcu_per_call",
                "dynamodb_wcu_per_resume",
                "dynamodb_usd_per_million_steps",
            ] {
                assert!(f[key].as_f64().unwrap() > 0.0, "{key}: {f}");
            }
        }
    }

    // The table: a column per store, a row per figure.
    let table = ok(
        d,
        &[&["bench", "--quick", "--compare"][..], &url_args[..1]].concat(),
    );
    let header = table
        .lines()
        .find(|l| l.starts_with("MEASURE"))
        .unwrap_or_else(|| panic!("no table header in {table}"));
    assert!(header.contains("sqlite"), "{table}");
    for what in [
        "W1 10-step call, 1 caller: calls/s",
        "W2 cold replay after SIGKILL: ms",
        "W2 fresh process spawn -> done: ms",
        "webhook POST -> resumed: p99 ms",
        "storage bytes per step",
        "worker RSS per parked run: KiB",
    ] {
        assert!(
            table.lines().any(|l| l.starts_with(what)),
            "{what}: {table}"
        );
    }
}
