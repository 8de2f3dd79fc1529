//! W3C trace context over gRPC metadata, so one client request is one trace.
//!
//! The propagator is the global one [`crate::init`] installs (TraceContext: `traceparent`,
//! `tracestate`). Without an exporter the current span has no OpenTelemetry context and these
//! functions inject nothing, so calling them unconditionally is fine.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use tonic::codegen::http;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Writes the current span's trace context into the request's metadata.
///
/// Call it inside the span that stands for the outgoing call (e.g. `draft.propose`), so the
/// server's spans become that span's children.
pub fn inject_context<T>(request: &mut tonic::Request<T>) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataInjector(request.metadata_mut()));
    });
}

/// A tonic interceptor doing [`inject_context`] on every call of a client:
/// `DraftClient::with_interceptor(channel, easd_telemetry::trace_interceptor)`.
///
/// It runs when the call starts, in the caller's current span.
pub fn trace_interceptor(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    inject_context(&mut request);
    Ok(request)
}

/// The remote caller's trace context carried in `metadata` (an empty context if none).
pub fn extract_context(metadata: &MetadataMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&MetadataExtractor(metadata)))
}

/// Makes `span` a child of the remote caller's span found in `metadata`.
///
/// Must be called before the span is first entered. Does nothing when the metadata carries
/// no context or when no OpenTelemetry layer is installed (logs-only mode).
pub fn set_remote_parent(span: &tracing::Span, metadata: &MetadataMap) {
    // Errors mean "no OpenTelemetry layer" or "span disabled": both are fine to ignore.
    let _ = span.set_parent(extract_context(metadata));
}

/// A server span per gRPC request, continuing the caller's trace; made for
/// `tonic::transport::Server::builder().trace_fn(easd_telemetry::server_span)`.
///
/// The span is named after the method (`easd.v1.Draft/Propose`, the OpenTelemetry RPC
/// convention) and has kind `server`; handler spans nest inside it.
pub fn server_span(request: &http::Request<()>) -> tracing::Span {
    let (method, service, rpc) = rpc_names(request.uri().path());
    let span = tracing::info_span!(
        "grpc.server",
        otel.name = method,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = rpc,
    );
    let headers = MetadataMap::from_headers(request.headers().clone());
    set_remote_parent(&span, &headers);
    span
}

/// `/pkg.Service/Method` → (`pkg.Service/Method`, `pkg.Service`, `Method`).
fn rpc_names(path: &str) -> (&str, &str, &str) {
    let method = path.strip_prefix('/').unwrap_or(path);
    let (service, rpc) = method.split_once('/').unwrap_or((method, ""));
    (method, service, rpc)
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // Propagator keys are lowercase ASCII; skip anything metadata cannot carry.
        if let (Ok(key), Ok(value)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(value.as_str()))
        {
            self.0.insert(key, value);
        }
    }
}

struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    fn remote_context() -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn a_context_survives_a_round_trip_through_grpc_metadata() {
        let propagator = TraceContextPropagator::new();
        let mut metadata = MetadataMap::new();
        propagator.inject_context(&remote_context(), &mut MetadataInjector(&mut metadata));
        assert_eq!(
            metadata.get("traceparent").unwrap().to_str().unwrap(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );

        let extracted = propagator.extract(&MetadataExtractor(&metadata));
        let span = extracted.span();
        let span_context = span.span_context();
        assert_eq!(span_context.trace_id(), TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap());
        assert_eq!(span_context.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert!(span_context.is_remote());
    }

    #[test]
    fn metadata_without_a_traceparent_yields_no_remote_span() {
        let mut metadata = MetadataMap::new();
        metadata.insert("traceparent", MetadataValue::from_static("garbage"));
        let extracted = TraceContextPropagator::new().extract(&MetadataExtractor(&metadata));
        assert!(!extracted.span().span_context().is_valid());
    }

    #[test]
    fn grpc_paths_split_into_method_service_and_rpc() {
        assert_eq!(rpc_names("/easd.v1.Verifier/Verify"), ("easd.v1.Verifier/Verify", "easd.v1.Verifier", "Verify"));
        assert_eq!(rpc_names("/odd"), ("odd", "odd", ""));
        assert_eq!(rpc_names(""), ("", "", ""));
    }
}
