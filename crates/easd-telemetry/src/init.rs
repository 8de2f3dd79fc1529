//! Process-wide setup: logs, the OTLP span exporter and the W3C propagator.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, fmt};

use crate::{Error, Result};

/// Spans exported by default: everything at `info` and above except the transport crates,
/// whose spans are noise in a request trace and would trace the exporter's own calls.
pub const DEFAULT_TRACE_FILTER: &str = "info,h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,\
     opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off";

/// What [`init_with`] sets up. [`TelemetryConfig::from_env`] reads the standard variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `service.name` resource attribute of every exported span (e.g. `easd-draft`).
    pub service_name: String,
    /// OTLP/gRPC collector URL (e.g. `http://otel-collector:4317`); `None` means logs only.
    pub otlp_endpoint: Option<String>,
    /// `EnvFilter` directives for the log output on stderr.
    pub log_filter: String,
    /// `EnvFilter` directives for the spans handed to the OTLP exporter.
    pub trace_filter: String,
}

impl TelemetryConfig {
    /// Reads `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, then `OTEL_EXPORTER_OTLP_ENDPOINT` (empty
    /// means unset), `RUST_LOG` (default `info`) and `EASD_TRACE_FILTER` (default
    /// [`DEFAULT_TRACE_FILTER`]). Other `OTEL_*` variables (headers, timeout,
    /// `OTEL_RESOURCE_ATTRIBUTES`) are honoured by the exporter and resource themselves.
    pub fn from_env(service_name: &str) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Self {
            service_name: service_name.to_owned(),
            otlp_endpoint: var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT")),
            log_filter: var("RUST_LOG").unwrap_or_else(|| "info".to_owned()),
            trace_filter: var("EASD_TRACE_FILTER").unwrap_or_else(|| DEFAULT_TRACE_FILTER.to_owned()),
        }
    }
}

/// Keeps the span exporter alive; dropping it flushes and shuts the exporter down.
///
/// Hold it for the whole of `main`. With OTLP enabled, drop it while the Tokio runtime is
/// still running (the exporter's connection lives on the runtime).
#[must_use = "dropping the guard shuts the span exporter down"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported over OTLP.
    pub fn is_exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports every finished span now (blocks until the collector answered or timed out).
    /// Call it from a runtime worker thread or `spawn_blocking`, never from a current-thread
    /// runtime: the export itself runs on the runtime.
    pub fn flush(&self) -> Result<()> {
        match &self.provider {
            Some(provider) => provider.force_flush().map_err(Error::Flush),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            // The subscriber is still installed, but the exporter is gone: stderr it is.
            eprintln!("easd-telemetry: flushing spans on shutdown failed: {err}");
        }
    }
}

/// Sets up logging and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OTLP span export for the
/// service `service_name`. Shorthand for `init_with(TelemetryConfig::from_env(service_name))`.
pub fn init(service_name: &str) -> Result<TelemetryGuard> {
    init_with(TelemetryConfig::from_env(service_name))
}

/// Installs the global subscriber and propagator described by `config`.
///
/// Fails if a global subscriber is already set, if a filter does not parse, or if OTLP is
/// requested outside a Tokio runtime.
pub fn init_with(config: TelemetryConfig) -> Result<TelemetryGuard> {
    let log_filter = parse_filter("log", &config.log_filter)?;
    let trace_filter = parse_filter("trace", &config.trace_filter)?;

    let provider =
        config.otlp_endpoint.as_deref().map(|endpoint| tracer_provider(&config.service_name, endpoint)).transpose()?;
    let otel_layer = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(config.service_name.clone()))
            .with_filter(trace_filter)
    });

    tracing_subscriber::registry()
        .with(fmt::layer().with_writer(std::io::stderr).with_filter(log_filter))
        .with(otel_layer)
        .try_init()
        .map_err(Error::SubscriberAlreadySet)?;

    // Set even without an exporter: harmless, and services stay uniform.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(provider) = &provider {
        opentelemetry::global::set_tracer_provider(provider.clone());
        tracing::info!(
            service = %config.service_name,
            endpoint = config.otlp_endpoint.as_deref().unwrap_or_default(),
            "exporting traces over OTLP/gRPC"
        );
    }
    Ok(TelemetryGuard { provider })
}

fn parse_filter(which: &'static str, directives: &str) -> Result<EnvFilter> {
    EnvFilter::builder().parse(directives).map_err(|source| Error::Filter {
        which,
        filter: directives.to_owned(),
        source,
    })
}

fn tracer_provider(service_name: &str, endpoint: &str) -> Result<SdkTracerProvider> {
    // tonic's lazy channel spawns its connection task on the current runtime.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::NoRuntime { endpoint: endpoint.to_owned() });
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| Error::Exporter { endpoint: endpoint.to_owned(), source })?;
    let resource = Resource::builder().with_service_name(service_name.to_owned()).build();
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(log_filter: &str, otlp_endpoint: Option<&str>) -> TelemetryConfig {
        TelemetryConfig {
            service_name: "test".into(),
            otlp_endpoint: otlp_endpoint.map(str::to_owned),
            log_filter: log_filter.into(),
            trace_filter: DEFAULT_TRACE_FILTER.into(),
        }
    }

    #[test]
    fn the_default_trace_filter_parses() {
        assert!(parse_filter("trace", DEFAULT_TRACE_FILTER).is_ok());
    }

    #[test]
    fn a_malformed_log_filter_is_a_clear_error_not_a_panic() {
        let err = init_with(config("info,=[", None)).unwrap_err();
        assert!(matches!(err, Error::Filter { which: "log", .. }), "{err}");
        assert!(err.to_string().contains("info,=["), "{err}");
    }

    #[test]
    fn otlp_outside_a_runtime_is_refused_with_the_endpoint_named() {
        let err = init_with(config("info", Some("http://127.0.0.1:4317"))).unwrap_err();
        assert!(matches!(err, Error::NoRuntime { .. }), "{err}");
        assert!(err.to_string().contains("127.0.0.1:4317"), "{err}");
    }
}
