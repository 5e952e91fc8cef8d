//! Golden stores (README, "Compatibility"): every DynamoDB export under `fixtures/golden/v*/`
//! (one item a line, in DynamoDB's JSON form, as `aws dynamodb scan` prints items), made by an
//! earlier eve, loads into a fresh table, opens with today's code, holds everything it was made
//! with, and its parked runs finish with today's engine.
//!
//! `cargo test -p eve-storage-dynamodb --test golden -- --ignored make_golden` writes this
//! version's export (against DynamoDB Local; run it once per release and commit the file).

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use eve_conformance::golden;
use eve_core::JournalStore;
use eve_storage_dynamodb::{DynamoConfig, DynamoStore};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn endpoint_or_skip(test: &str) -> Option<String> {
    // Never let the SDK look for credentials or probe instance metadata.
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    match std::env::var("EVE_TEST_DYNAMODB_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            println!("skipped: {test}: EVE_TEST_DYNAMODB_ENDPOINT is unset; set it (e.g. http://127.0.0.1:8000, DynamoDB Local) to run it");
            None
        }
    }
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

/// An attribute in DynamoDB's JSON form (`{"S": "…"}`, `{"N": "1"}`, `{"B": "<base64>"}`, …).
fn to_json(v: &AttributeValue) -> Value {
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::B(b) => json!({ "B": aws_smithy_types::base64::encode(b.as_ref()) }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        AttributeValue::Null(n) => json!({ "NULL": n }),
        AttributeValue::Ss(s) => json!({ "SS": s }),
        AttributeValue::Ns(n) => json!({ "NS": n }),
        AttributeValue::L(l) => json!({ "L": l.iter().map(to_json).collect::<Vec<_>>() }),
        AttributeValue::M(m) => json!({ "M": item_to_json(m) }),
        other => panic!("an attribute type the golden export does not know: {other:?}"),
    }
}

fn item_to_json(item: &HashMap<String, AttributeValue>) -> Map<String, Value> {
    let mut keys: Vec<&String> = item.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| (k.clone(), to_json(&item[k])))
        .collect()
}

fn from_json(v: &Value) -> AttributeValue {
    let (kind, v) = v
        .as_object()
        .and_then(|o| o.iter().next())
        .unwrap_or_else(|| panic!("an attribute is a one-key object: {v}"));
    let text = || v.as_str().expect("a string").to_owned();
    let texts = || {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|s| s.as_str().expect("a string").to_owned())
            .collect()
    };
    match kind.as_str() {
        "S" => AttributeValue::S(text()),
        "N" => AttributeValue::N(text()),
        "B" => AttributeValue::B(Blob::new(
            aws_smithy_types::base64::decode(text()).expect("base64"),
        )),
        "BOOL" => AttributeValue::Bool(v.as_bool().expect("a bool")),
        "NULL" => AttributeValue::Null(v.as_bool().expect("a bool")),
        "SS" => AttributeValue::Ss(texts()),
        "NS" => AttributeValue::Ns(texts()),
        "L" => AttributeValue::L(
            v.as_array()
                .expect("a list")
                .iter()
                .map(from_json)
                .collect(),
        ),
        "M" => AttributeValue::M(item_from_json(v)),
        other => panic!("unknown attribute type {other}"),
    }
}

fn item_from_json(v: &Value) -> HashMap<String, AttributeValue> {
    v.as_object()
        .expect("an item is an object")
        .iter()
        .map(|(k, v)| (k.clone(), from_json(v)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_dynamodb_exports_load_and_finish() {
    let Some(endpoint) = endpoint_or_skip("golden_dynamodb_exports_load_and_finish") else {
        return;
    };
    let mut exports: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("fixtures/golden exists")
        .map(|e| {
            e.expect("a directory entry")
                .path()
                .join("dynamodb/items.jsonl")
        })
        .collect();
    exports.sort();
    assert!(!exports.is_empty(), "at least one golden version");
    for export in exports {
        let text = std::fs::read_to_string(&export)
            .unwrap_or_else(|e| panic!("read {}: {e}", export.display()));
        let table = format!("eve_golden_{}", uuid::Uuid::new_v4().simple());
        let store = DynamoStore::connect(DynamoConfig::local(&endpoint, &table))
            .await
            .expect("connect to DynamoDB Local");
        store.create_table().await.expect("create a fresh table");
        let client = DynamoConfig::local(&endpoint, &table).sdk_client();
        let mut n = 0;
        for line in text.lines() {
            let item: Value = serde_json::from_str(line).expect("an item as JSON");
            client
                .put_item()
                .table_name(&table)
                .set_item(Some(item_from_json(&item)))
                .send()
                .await
                .unwrap_or_else(|e| panic!("load an item into {table}: {e:?}"));
            n += 1;
        }
        let store: Arc<dyn JournalStore> = Arc::new(store);
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(golden::check(
            Arc::clone(&store),
        )))
        .await;
        let _ = client.delete_table().table_name(&table).send().await;
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
        println!(
            "{}: {n} items loaded, checked, parked runs finished",
            export.display()
        );
    }
}

/// Writes `fixtures/golden/v<this version>/dynamodb/items.jsonl`: every item of a table the
/// golden data was made in, sorted by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes this version's golden fixture; run by hand at a release"]
async fn make_golden() {
    let endpoint = endpoint_or_skip("make_golden").expect("EVE_TEST_DYNAMODB_ENDPOINT is set");
    let table = format!("eve_golden_make_{}", uuid::Uuid::new_v4().simple());
    let store = DynamoStore::connect(DynamoConfig::local(&endpoint, &table))
        .await
        .expect("connect to DynamoDB Local");
    store.create_table().await.expect("create a fresh table");
    let store: Arc<dyn JournalStore> = Arc::new(store);
    golden::populate(Arc::clone(&store)).await;
    let client = DynamoConfig::local(&endpoint, &table).sdk_client();
    let mut items: Vec<Map<String, Value>> = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(&table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan the golden table");
        items.extend(page.items().iter().map(item_to_json));
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            break;
        }
    }
    let key = |i: &Map<String, Value>| (i["pk"].to_string(), i["sk"].to_string());
    items.sort_by_key(key);
    let dir = golden_dir()
        .join(format!("v{}", env!("CARGO_PKG_VERSION")))
        .join("dynamodb");
    std::fs::create_dir_all(&dir).expect("create the fixture directory");
    let text: String = items
        .iter()
        .map(|i| format!("{}\n", Value::Object(i.clone())))
        .collect();
    std::fs::write(dir.join("items.jsonl"), text).expect("write items.jsonl");
    client
        .delete_table()
        .table_name(&table)
        .send()
        .await
        .expect("delete the golden table");
    println!("wrote {} ({} items)", dir.display(), items.len());
}
