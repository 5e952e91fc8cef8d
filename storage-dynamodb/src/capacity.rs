//! Consumed capacity: every request a store makes asks DynamoDB for
//! `ReturnConsumedCapacity: TOTAL`, and the read and write capacity units in the answers are
//! added up per store handle ([`crate::DynamoStore::consumed_capacity`]). One SDK interceptor
//! does both, so no call site can forget either.

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::{
    batch_get_item::{BatchGetItemInput, BatchGetItemOutput},
    batch_write_item::{BatchWriteItemInput, BatchWriteItemOutput},
    delete_item::{DeleteItemInput, DeleteItemOutput},
    get_item::{GetItemInput, GetItemOutput},
    put_item::{PutItemInput, PutItemOutput},
    query::{QueryInput, QueryOutput},
    scan::{ScanInput, ScanOutput},
    transact_get_items::{TransactGetItemsInput, TransactGetItemsOutput},
    transact_write_items::{TransactWriteItemsInput, TransactWriteItemsOutput},
    update_item::{UpdateItemInput, UpdateItemOutput},
};
use aws_sdk_dynamodb::types::{ConsumedCapacity as Consumed, ReturnConsumedCapacity};
use std::sync::{Arc, Mutex};

/// Capacity units DynamoDB reported as consumed by a store handle's successful requests, and
/// how many of those requests reported none.
///
/// The units are what DynamoDB bills on demand as read and write request units: a strongly
/// consistent read of up to 4 KB is 1 RCU (an eventually consistent one ½), a write of up to
/// 1 KB is 1 WCU, and a transaction counts each item twice. Requests that fail (a condition
/// that does not hold, a cancelled transaction, throttling) return no figure, so they are not
/// in these totals although AWS bills the write units of a failed conditional write.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConsumedCapacity {
    /// Read capacity units.
    pub read_units: f64,
    /// Write capacity units.
    pub write_units: f64,
    /// Successful data-plane requests that reported their capacity.
    pub reported: u64,
    /// Successful data-plane requests whose answer carried no consumed capacity (DynamoDB
    /// Local leaves it out for some calls).
    pub unreported: u64,
}

impl ConsumedCapacity {
    /// The units consumed since `earlier` was taken.
    pub fn since(&self, earlier: &ConsumedCapacity) -> ConsumedCapacity {
        ConsumedCapacity {
            read_units: self.read_units - earlier.read_units,
            write_units: self.write_units - earlier.write_units,
            reported: self.reported - earlier.reported,
            unreported: self.unreported - earlier.unreported,
        }
    }
}

/// Sets `ReturnConsumedCapacity: TOTAL` on every data-plane request and adds up the answers.
#[derive(Clone, Debug, Default)]
pub(crate) struct CapacityMeter {
    totals: Arc<Mutex<ConsumedCapacity>>,
}

impl CapacityMeter {
    pub(crate) fn totals(&self) -> ConsumedCapacity {
        *self.totals.lock().expect("capacity lock")
    }

    fn add(&self, is_write: bool, consumed: &[&Consumed]) {
        let mut t = self.totals.lock().expect("capacity lock");
        if consumed.is_empty() {
            t.unreported += 1;
            return;
        }
        t.reported += 1;
        for c in consumed {
            let (r, w) = (c.read_capacity_units(), c.write_capacity_units());
            if r.is_none() && w.is_none() {
                // TOTAL answers may carry only the sum; the operation says which kind it is.
                let units = c.capacity_units().unwrap_or(0.0);
                if is_write {
                    t.write_units += units;
                } else {
                    t.read_units += units;
                }
            } else {
                t.read_units += r.unwrap_or(0.0);
                t.write_units += w.unwrap_or(0.0);
            }
        }
    }
}

fn one(c: &Option<Consumed>) -> Vec<&Consumed> {
    c.iter().collect()
}

fn many(c: &Option<Vec<Consumed>>) -> Vec<&Consumed> {
    c.iter().flatten().collect()
}

macro_rules! ask_total {
    ($input:expr, $($ty:ty),+) => {{
        let input = $input;
        $(
            if let Some(i) = input.downcast_mut::<$ty>() {
                i.return_consumed_capacity = Some(ReturnConsumedCapacity::Total);
            }
        )+
    }};
}

impl Intercept for CapacityMeter {
    fn name(&self) -> &'static str {
        "eve::CapacityMeter"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        ask_total!(
            context.input_mut(),
            GetItemInput,
            QueryInput,
            ScanInput,
            BatchGetItemInput,
            TransactGetItemsInput,
            PutItemInput,
            UpdateItemInput,
            DeleteItemInput,
            BatchWriteItemInput,
            TransactWriteItemsInput
        );
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Ok(out) = context.output_or_error() else {
            return Ok(());
        };
        if let Some(o) = out.downcast_ref::<GetItemOutput>() {
            self.add(false, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<QueryOutput>() {
            self.add(false, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<ScanOutput>() {
            self.add(false, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<BatchGetItemOutput>() {
            self.add(false, &many(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<TransactGetItemsOutput>() {
            self.add(false, &many(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<PutItemOutput>() {
            self.add(true, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<UpdateItemOutput>() {
            self.add(true, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<DeleteItemOutput>() {
            self.add(true, &one(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<BatchWriteItemOutput>() {
            self.add(true, &many(&o.consumed_capacity));
        } else if let Some(o) = out.downcast_ref::<TransactWriteItemsOutput>() {
            self.add(true, &many(&o.consumed_capacity));
        }
        Ok(())
    }
}
