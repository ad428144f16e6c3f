//! The clients' side (the agent, `hvctl`, the tests): the CA that signed
//! the coordinator's certificate, and this client's certificate and key.
//!
//! The files are read when a connection is made, so a client that
//! reconnects uses a rotated certificate from then on without a restart.

use std::path::Path;
use std::time::SystemTime;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::{TlsError, TlsFiles, read};

/// tonic's client TLS setting for `files`, read now.
pub fn config(files: &TlsFiles) -> Result<ClientTlsConfig, TlsError> {
    let cert = read(&files.cert)?;
    let key = read(&files.key)?;
    // Parsed here, so a broken file is named now rather than as a handshake
    // failure later.
    crate::server::parse_certs(&files.cert, &cert)?;
    config_in_memory(&files.ca, &cert, &key)
}

/// tonic's client TLS setting with this client's certificate chain and key
/// held in memory (an agent's certificate from the coordinator), and the
/// CA file `ca` read now.
pub fn config_in_memory(ca: &Path, cert_pem: &[u8], key_pem: &[u8]) -> Result<ClientTlsConfig, TlsError> {
    let ca_pem = read(ca)?;
    crate::server::parse_certs(ca, &ca_pem)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(Identity::from_pem(cert_pem, key_pem)))
}

/// tonic's client TLS setting without a client certificate: the CA file
/// `ca` read now (an agent asking for its first certificate).
pub fn config_without_identity(ca: &Path) -> Result<ClientTlsConfig, TlsError> {
    let ca_pem = read(ca)?;
    crate::server::parse_certs(ca, &ca_pem)?;
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)))
}

/// The end (notAfter) of the first certificate in `cert` as the file is
/// now: the one a connection made now would present.
pub fn certificate_not_after(cert: &Path) -> Result<SystemTime, TlsError> {
    let certs = crate::server::certs(cert)?;
    certs
        .first()
        .and_then(crate::not_after)
        .ok_or_else(|| TlsError::Pem { path: cert.to_path_buf(), what: "its validity cannot be read".into() })
}
