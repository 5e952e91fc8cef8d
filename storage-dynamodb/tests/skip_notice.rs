//! Says, outside the test harness's output capture, whether the DynamoDB tests ran: plain
//! `cargo test` without `EVE_TEST_DYNAMODB_ENDPOINT` passes them as skipped, and this makes that
//! visible.

fn main() {
    match std::env::var("EVE_TEST_DYNAMODB_ENDPOINT") {
        Ok(endpoint) => println!("eve-storage-dynamodb: DynamoDB tests run against {endpoint}"),
        Err(_) => println!(
            "\n*** eve-storage-dynamodb: the DynamoDB tests were SKIPPED: EVE_TEST_DYNAMODB_ENDPOINT is unset.\n\
             *** Start DynamoDB Local with `bash .ci/dynamodb-local.sh` and rerun with\n\
             *** EVE_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 AWS_EC2_METADATA_DISABLED=true\n"
        ),
    }
}
