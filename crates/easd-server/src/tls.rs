//! TLS settings from PEM files: servers (workers with mutual TLS, the coordinator's client API) and the
//! coordinator's client side towards its workers.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::error::ServerError;

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, ServerError> {
    std::fs::read(path).map_err(|e| ServerError::invalid(what, format!("cannot read {}: {e}", path.display())))
}

/// Server TLS; with `client_ca`, clients must present a certificate signed by it (mutual TLS).
pub fn server_tls(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTlsConfig, ServerError> {
    let identity = Identity::from_pem(read(cert, "tls_cert")?, read(key, "tls_key")?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca, "tls_client_ca")?));
    }
    Ok(tls)
}

/// Client TLS towards workers: trust `ca`, present `cert`/`key` when given (mutual TLS), and expect the
/// workers' certificates to name `domain` (default: the host of each URL).
pub fn client_tls(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    domain: Option<&str>,
) -> Result<ClientTlsConfig, ServerError> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "worker_ca")?));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(read(cert, "tls_client_cert")?, read(key, "tls_client_key")?));
    }
    if let Some(domain) = domain {
        tls = tls.domain_name(domain);
    }
    Ok(tls)
}
