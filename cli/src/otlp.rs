//! OTLP export of the engine's spans ([`eve_core::trace`]): an [`OtlpSink`] hands each finished
//! span to OpenTelemetry's batch span processor, which exports batches over OTLP/HTTP
//! (protobuf) on its own thread, off the worker's path.
//!
//! Configured the standard way: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (export is off unless one is set, or `--otlp URL` is given),
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` (default service name `eve`), `OTEL_BSP_*` for the batching;
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
//!
//! The exporter is the cargo feature `otlp` (off by default); without it asking for export
//! fails with exit code 2, naming the feature.

use crate::error::CliError;
#[cfg(feature = "otlp")]
use eve_core::trace::{AttrValue, SpanStatus};
use eve_core::trace::{Span, TraceSink};
#[cfg(feature = "otlp")]
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
#[cfg(feature = "otlp")]
use opentelemetry::{InstrumentationScope, KeyValue};
#[cfg(feature = "otlp")]
use opentelemetry_otlp::{Protocol, WithExportConfig};
#[cfg(feature = "otlp")]
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanProcessor};
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;
#[cfg(feature = "otlp")]
use std::fmt;
use std::sync::Arc;
#[cfg(feature = "otlp")]
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "otlp")]
/// Reports the engine's spans to an OTLP/HTTP endpoint through a batch processor.
pub struct OtlpSink {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
}

#[cfg(feature = "otlp")]
impl fmt::Debug for OtlpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpSink").finish_non_exhaustive()
    }
}

/// Whether the environment asks for trace export: an OTLP endpoint is set and the SDK is not
/// disabled.
pub fn configured_by_env() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let off = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !off && (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// The sink `--otlp URL` or the environment asks for, if any.
///
/// # Errors
/// `Usage` when the exporter cannot be built (a bad URL, a protocol other than HTTP);
/// `NotCompiled` when `--otlp` is given and this build has no OTLP export (cargo feature
/// `otlp`). An `OTEL_EXPORTER_OTLP_*ENDPOINT` variable in such a build is only warned about:
/// a machine-wide setting meant for other services must not stop eve from starting.
pub fn from_args(otlp: Option<&str>) -> Result<Option<Arc<OtlpSink>>, CliError> {
    sink_for(otlp, configured_by_env())
}

/// [`from_args`] with what the environment asks for given.
fn sink_for(otlp: Option<&str>, by_env: bool) -> Result<Option<Arc<OtlpSink>>, CliError> {
    if otlp.is_none() && !by_env {
        return Ok(None);
    }
    #[cfg(feature = "otlp")]
    return Ok(Some(Arc::new(OtlpSink::new(otlp)?)));
    #[cfg(not(feature = "otlp"))]
    match otlp {
        Some(_) => Err(CliError::NotCompiled {
            what: "span export (--otlp)",
            feature: "otlp",
        }),
        None => {
            tracing::warn!(
                "an OTEL_EXPORTER_OTLP_*ENDPOINT variable is set but this eve was built without span export (cargo feature `otlp`): no spans are exported"
            );
            Ok(None)
        }
    }
}

/// This build has no OTLP export (the cargo feature `otlp` is off): there is no sink, and
/// [`from_args`] refuses when export is asked for.
#[cfg(not(feature = "otlp"))]
#[derive(Debug)]
pub enum OtlpSink {}

#[cfg(not(feature = "otlp"))]
impl OtlpSink {
    /// Never called: no value of this type exists.
    pub fn shutdown(&self, _timeout: std::time::Duration) {
        match *self {}
    }
}

#[cfg(not(feature = "otlp"))]
impl TraceSink for OtlpSink {
    fn export(&self, _span: Span) {
        match *self {}
    }
}

#[cfg(feature = "otlp")]
impl OtlpSink {
    /// An exporter to `endpoint` (an OTLP base URL such as `http://127.0.0.1:4318`, to which
    /// `/v1/traces` is added), or to what the `OTEL_*` variables say when `None`.
    ///
    /// # Errors
    /// `Usage` when the exporter cannot be built.
    pub fn new(endpoint: Option<&str>) -> Result<Self, CliError> {
        if let Ok(p) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL") {
            if p.starts_with("grpc") {
                return Err(CliError::Usage(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={p}: eve exports traces over OTLP/HTTP only; set it to http/protobuf (collectors listen on port 4318 for it)"
                )));
            }
        }
        let endpoint = endpoint.map(|e| {
            let e = e.trim_end_matches('/');
            if e.ends_with("/v1/traces") {
                e.to_owned()
            } else {
                format!("{e}/v1/traces")
            }
        });
        // The blocking HTTP client must not be built (or dropped) on an async runtime's
        // thread: build the exporter and the processor on a plain one.
        let built = std::thread::spawn(move || {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary);
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            let exporter = b.build().map_err(|e| e.to_string())?;
            let mut processor = BatchSpanProcessor::builder(exporter).build();
            let resource = Resource::builder()
                .with_service_name(service_name())
                .build();
            processor.set_resource(&resource);
            Ok::<_, String>(processor)
        })
        .join()
        .map_err(|_| CliError::Usage("building the OTLP exporter panicked".into()))?
        .map_err(|e| CliError::Usage(format!("cannot export traces over OTLP: {e}")))?;
        Ok(Self {
            processor: built,
            scope: InstrumentationScope::builder("eve")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// Exports what is queued and stops the processor (at most `timeout`).
    pub fn shutdown(&self, timeout: Duration) {
        if let Err(e) = self.processor.shutdown_with_timeout(timeout) {
            tracing::warn!(error = %e, "OTLP: spans may be lost at shutdown");
        }
    }
}

#[cfg(feature = "otlp")]
/// `OTEL_SERVICE_NAME`, else `eve` (the resource builder reads `OTEL_RESOURCE_ATTRIBUTES`).
fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "eve".to_owned())
}

#[cfg(feature = "otlp")]
fn time(t: eve_core::Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(t.millis()).unwrap_or(0))
}

#[cfg(feature = "otlp")]
impl TraceSink for OtlpSink {
    fn export(&self, span: Span) {
        let flags = TraceFlags::new(span.flags);
        let parent_is_remote = span.attr("gen_ai.operation.name").is_some();
        let data = SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(span.trace_id.0),
                SpanId::from_bytes(span.span_id.0),
                flags,
                false,
                TraceState::default(),
            ),
            parent_span_id: span
                .parent_span_id
                .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.0)),
            parent_span_is_remote: parent_is_remote && span.parent_span_id.is_some(),
            span_kind: SpanKind::Internal,
            name: span.name.into(),
            start_time: time(span.start),
            end_time: time(span.end),
            attributes: span
                .attributes
                .into_iter()
                .map(|(k, v)| match v {
                    AttrValue::Str(s) => KeyValue::new(k, s),
                    AttrValue::Int(i) => KeyValue::new(k, i),
                    AttrValue::Bool(b) => KeyValue::new(k, b),
                })
                .collect(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: match span.status {
                SpanStatus::Unset => Status::Unset,
                SpanStatus::Error(d) => Status::error(d),
            },
            instrumentation_scope: self.scope.clone(),
        };
        self.processor.on_end(data);
    }
}

#[cfg(all(test, not(feature = "otlp")))]
mod tests {
    use super::*;

    /// Without the `otlp` feature: `--otlp` is refused naming the feature; the environment
    /// alone only warns, and nothing is exported.
    #[test]
    fn a_build_without_export_refuses_the_flag_and_warns_on_the_environment() {
        assert!(matches!(
            sink_for(Some("http://127.0.0.1:4318"), false),
            Err(CliError::NotCompiled {
                feature: "otlp",
                ..
            })
        ));
        assert!(matches!(sink_for(None, true), Ok(None)));
        assert!(matches!(sink_for(None, false), Ok(None)));
    }
}
