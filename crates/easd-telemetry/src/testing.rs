//! An in-process OTLP trace receiver for tests (cargo feature `testing`).
//!
//! It implements `opentelemetry.proto.collector.trace.v1.TraceService` on a loopback port and
//! keeps every span it is sent, flattened to what assertions need. Point services at it with
//! `OTEL_EXPORTER_OTLP_ENDPOINT=<receiver.endpoint()>`, run a request, then
//! [`OtlpReceiver::wait_for`] the spans (services flush on shutdown, or after the batch delay).
//!
//! ```no_run
//! # async fn demo() -> easd_telemetry::Result<()> {
//! use std::time::Duration;
//! use easd_telemetry::testing::OtlpReceiver;
//!
//! let receiver = OtlpReceiver::start().await?;
//! // spawn services with OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint(), make one request…
//! let spans = receiver
//!     .wait_for(Duration::from_secs(10), |spans| spans.iter().any(|s| s.name == "session"))
//!     .await?;
//! let session = spans.iter().find(|s| s.name == "session").unwrap();
//! assert!(spans.iter().filter(|s| s.is_child_of(session)).count() > 0);
//! # Ok(()) }
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::TcpListenerStream;

use crate::{Error, Result};

/// One exported span, flattened. Ids are lowercase hex as in `traceparent`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    /// The span name (`otel.name` if the tracing span set it).
    pub name: String,
    /// `server`, `client`, `internal`, `producer`, `consumer` or `unspecified`.
    pub kind: &'static str,
    /// The `service.name` resource attribute of the exporting process.
    pub service_name: String,
    /// Span attributes, values rendered as strings.
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    /// The value of attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Whether `parent` is this span's direct parent (same trace, linked by id).
    pub fn is_child_of(&self, parent: &ReceivedSpan) -> bool {
        self.trace_id == parent.trace_id && self.parent_span_id.as_deref() == Some(parent.span_id.as_str())
    }

    /// Whether `ancestor` is reached by following parent links through `spans` (any depth).
    pub fn descends_from(&self, ancestor: &ReceivedSpan, spans: &[ReceivedSpan]) -> bool {
        let mut current = self;
        // Bounded by the number of spans, so a malformed cycle cannot loop forever.
        for _ in 0..spans.len() {
            if current.is_child_of(ancestor) {
                return true;
            }
            match spans.iter().find(|s| current.is_child_of(s)) {
                Some(parent) => current = parent,
                None => return false,
            }
        }
        false
    }
}

/// A running OTLP/gRPC trace receiver on `127.0.0.1`; stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    endpoint: String,
    spans: watch::Receiver<Vec<ReceivedSpan>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl OtlpReceiver {
    /// Binds an ephemeral loopback port and starts serving.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| Error::Receiver(format!("binding: {err}")))?;
        let addr = listener.local_addr().map_err(|err| Error::Receiver(format!("local address: {err}")))?;
        let (spans_tx, spans) = watch::channel(Vec::new());
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let service = TraceServiceServer::new(Collector { spans: spans_tx });
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = shutdown_rx.await;
                })
                .await;
            if let Err(err) = served {
                eprintln!("OTLP test receiver stopped: {err}");
            }
        });
        Ok(Self { endpoint: format!("http://{addr}"), spans, shutdown: Some(shutdown) })
    }

    /// The URL to export to (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.borrow().clone()
    }

    /// Waits until `done(spans)` holds (checked on every export), or fails after `timeout`
    /// with the spans seen so far in the message.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Result<Vec<ReceivedSpan>> {
        let mut spans = self.spans.clone();
        let waited = tokio::time::timeout(timeout, spans.wait_for(|spans| done(spans))).await;
        match waited {
            Ok(Ok(spans)) => Ok(spans.clone()),
            Ok(Err(_)) => Err(Error::Receiver("the receiver stopped".into())),
            Err(_) => Err(Error::Receiver(format!(
                "condition not met within {timeout:?}; spans received:\n{}",
                describe(&self.spans())
            ))),
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// One line per span (`service name id parent trace`), for assertion messages.
pub fn describe(spans: &[ReceivedSpan]) -> String {
    let mut out = String::new();
    for span in spans {
        let _ = writeln!(
            out,
            "  [{}] {} ({}) span={} parent={} trace={}",
            span.service_name,
            span.name,
            span.kind,
            span.span_id,
            span.parent_span_id.as_deref().unwrap_or("-"),
            span.trace_id,
        );
    }
    out
}

struct Collector {
    spans: watch::Sender<Vec<ReceivedSpan>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service_name = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| render(kv.value.as_ref()))
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                received.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty()).then(|| hex(&span.parent_span_id)),
                    kind: kind_name(span.kind),
                    name: span.name,
                    service_name: service_name.clone(),
                    attributes: span.attributes.iter().map(attribute).collect(),
                });
            }
        }
        self.spans.send_modify(|spans| spans.extend(received));
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn kind_name(kind: i32) -> &'static str {
    match SpanKind::try_from(kind) {
        Ok(SpanKind::Server) => "server",
        Ok(SpanKind::Client) => "client",
        Ok(SpanKind::Internal) => "internal",
        Ok(SpanKind::Producer) => "producer",
        Ok(SpanKind::Consumer) => "consumer",
        Ok(SpanKind::Unspecified) | Err(_) => "unspecified",
    }
}

fn attribute(kv: &KeyValue) -> (String, String) {
    (kv.key.clone(), render(kv.value.as_ref()))
}

fn render(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex(b),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn string_kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(Value::StringValue(value.into())) }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn exported_spans_are_flattened_with_ids_in_hex() {
        let receiver = OtlpReceiver::start().await.unwrap();
        let mut client = TraceServiceClient::connect(receiver.endpoint().to_owned()).await.unwrap();
        let span = Span {
            trace_id: vec![0xab; 16],
            span_id: vec![1, 2, 3, 4, 5, 6, 7, 8],
            parent_span_id: vec![9; 8],
            name: "verify".into(),
            kind: SpanKind::Client as i32,
            attributes: vec![string_kv("session_id", "s-1")],
            ..Default::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![string_kv("service.name", "easd-coordinator")],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans { spans: vec![span], ..Default::default() }],
                ..Default::default()
            }],
        };
        client.export(request).await.unwrap();

        let spans = receiver.wait_for(Duration::from_secs(5), |spans| !spans.is_empty()).await.unwrap();
        assert_eq!(
            spans,
            vec![ReceivedSpan {
                trace_id: "ab".repeat(16),
                span_id: "0102030405060708".into(),
                parent_span_id: Some("0909090909090909".into()),
                name: "verify".into(),
                kind: "client",
                service_name: "easd-coordinator".into(),
                attributes: vec![("session_id".into(), "s-1".into())],
            }]
        );
        assert_eq!(spans[0].attribute("session_id"), Some("s-1"));
    }

    fn span(id: &str, parent: Option<&str>) -> ReceivedSpan {
        ReceivedSpan {
            trace_id: "t".into(),
            span_id: id.into(),
            parent_span_id: parent.map(str::to_owned),
            name: id.into(),
            kind: "internal",
            service_name: "s".into(),
            attributes: Vec::new(),
        }
    }

    #[test]
    fn descent_follows_parent_links_at_any_depth_and_survives_cycles() {
        let spans = vec![
            span("root", None),
            span("step", Some("root")),
            span("call", Some("step")),
            span("other", None),
            span("loop-a", Some("loop-b")),
            span("loop-b", Some("loop-a")),
        ];
        let [root, step, call, other, loop_a, _] = &spans[..] else { unreachable!() };
        assert!(call.descends_from(root, &spans));
        assert!(call.descends_from(step, &spans));
        assert!(!root.descends_from(call, &spans));
        assert!(!call.descends_from(other, &spans));
        assert!(!loop_a.descends_from(root, &spans));
    }

    #[tokio::test]
    async fn waiting_for_spans_that_never_come_times_out_with_a_message() {
        let receiver = OtlpReceiver::start().await.unwrap();
        let err = receiver.wait_for(Duration::from_millis(50), |spans| !spans.is_empty()).await.unwrap_err();
        assert!(err.to_string().contains("not met within"), "{err}");
    }
}
