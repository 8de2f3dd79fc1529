//! One trace across a real gRPC hop: spans exported over OTLP to the in-process receiver keep
//! their parent links, and the server span joins the caller's trace only through metadata.
//!
//! Its own test binary because `init_with` installs process-wide state.

use std::time::Duration;

use easd_telemetry::testing::{OtlpReceiver, ReceivedSpan, describe};
use easd_telemetry::{DEFAULT_TRACE_FILTER, TelemetryConfig, init_with, server_span, trace_interceptor};
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tracing::Instrument as _;

const CHECK: &str = "grpc.health.v1.Health/Check";

fn find<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no span {name}:\n{}", describe(spans)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_spans_and_a_grpc_hop_arrive_as_one_linked_trace() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let guard = init_with(TelemetryConfig {
        service_name: "easd-telemetry-test".into(),
        otlp_endpoint: Some(receiver.endpoint().to_owned()),
        log_filter: "warn".into(),
        trace_filter: DEFAULT_TRACE_FILTER.into(),
    })
    .unwrap();
    assert!(guard.is_exporting());

    // A gRPC server whose requests get server spans continuing the caller's trace.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .trace_fn(server_span)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut traced = HealthClient::with_interceptor(channel.clone(), trace_interceptor);
    let mut plain = HealthClient::new(channel);

    let session = tracing::info_span!("session", session_id = "s-42", mode = "easd");
    async {
        let step = tracing::info_span!("step", k = 4);
        async {
            let call = tracing::info_span!("verify.call", otel.kind = "client", replica = "r1");
            traced.check(HealthCheckRequest::default()).instrument(call).await.unwrap();
            // The same hop without propagation: the server cannot know the caller's trace.
            let call = tracing::info_span!("untraced.call", otel.kind = "client");
            plain.check(HealthCheckRequest::default()).instrument(call).await.unwrap();
        }
        .instrument(step)
        .await;
    }
    .instrument(session)
    .await;

    // force_flush blocks on the exporter, which runs on this runtime: keep it off the workers.
    let guard = tokio::task::spawn_blocking(move || {
        guard.flush().unwrap();
        guard
    })
    .await
    .unwrap();
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().filter(|s| s.name == CHECK).count() == 2 && spans.iter().any(|s| s.name == "session")
        })
        .await
        .unwrap();

    let session = find(&spans, "session");
    let step = find(&spans, "step");
    let call = find(&spans, "verify.call");
    let untraced = find(&spans, "untraced.call");
    let servers: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == CHECK).collect();
    let linked = servers.iter().find(|s| s.is_child_of(call));
    let linked = linked.unwrap_or_else(|| panic!("no server span under verify.call:\n{}", describe(&spans)));
    let orphan = servers.iter().find(|s| s.span_id != linked.span_id).unwrap();

    assert_eq!(session.parent_span_id, None, "{}", describe(&spans));
    assert!(step.is_child_of(session), "{}", describe(&spans));
    assert!(call.is_child_of(step), "{}", describe(&spans));
    assert!(untraced.is_child_of(step), "{}", describe(&spans));
    assert_eq!(linked.kind, "server");
    assert_eq!(call.kind, "client");
    assert_eq!(linked.attribute("rpc.method"), Some("Check"));
    assert_eq!(session.attribute("session_id"), Some("s-42"));
    assert_eq!(session.service_name, "easd-telemetry-test");
    assert_eq!(orphan.parent_span_id, None, "{}", describe(&spans));
    assert_ne!(orphan.trace_id, session.trace_id);
    drop(guard);
}
