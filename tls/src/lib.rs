//! Mutual TLS between the agents and the coordinator
//! ([docs/decisions/0016](../../docs/decisions/0016-mutual-tls-and-node-identity.md)).
//!
//! Anyone who reaches the coordinator's gRPC port could otherwise speak for
//! any node: send a passing check report and have an untested host enabled
//! in Nova, or keep a dead node looking alive. So every gRPC client shows a
//! certificate from the configured CA, and an agent's certificate names the
//! one node it may speak for ([`identity`]). Certificates and keys are read
//! again when their files change (cert-manager rotates them in place), by
//! the server on the next handshake ([`server`]) and by the clients on the
//! next connection ([`client`]).

pub mod client;
pub mod identity;
mod reload;
pub mod server;

use std::path::{Path, PathBuf};

pub use identity::{node_of, node_uri, not_after, sre_of};

/// The three files of one side: its certificate chain, its key, and the CA
/// that signs the other side's certificates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA {path}: {what}")]
    Verifier { path: PathBuf, what: String },
}

/// The certificates of the PEM file `path`, read now.
pub fn certificates(path: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, TlsError> {
    server::certs(path)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

/// An error with its causes: a client's "transport error" alone does not
/// say that the certificate was refused, or which.
pub fn explain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
