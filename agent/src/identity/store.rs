//! The certificate and key kept in the pod's own directory, so that a
//! restarted container goes on with them: one file (key, then chain), made
//! whole before it replaces the last (written aside, then renamed), readable
//! by this user alone. Its modification time is when it was received.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::Issued;

const FILE: &str = "identity.pem";

pub(super) fn save(dir: &Path, issued: &Issued) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let aside = dir.join(format!("{FILE}.new"));
    // One left by a crash keeps its mode when opened again: made anew.
    let _ = std::fs::remove_file(&aside);
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&aside)?;
    f.write_all(&issued.key_pem)?;
    f.write_all(&issued.chain_pem)?;
    f.sync_all()?;
    std::fs::rename(aside, dir.join(FILE))
}

/// The kept certificate for `node`, if one reads whole.
pub(super) fn load(dir: &Path, node: &str) -> Option<Issued> {
    let path = dir.join(FILE);
    let text = std::fs::read(&path).ok()?;
    let received = std::fs::metadata(&path).ok()?.modified().ok()?;
    let key_end = find(&text, b"-----BEGIN CERTIFICATE-----")?;
    let (key_pem, chain_pem) = text.split_at(key_end);
    let mut issued = super::obtain::issued(chain_pem.to_vec(), key_pem.to_vec(), node).ok()?;
    issued.received = received;
    Some(issued)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    fn a_certificate(node: &str) -> (Vec<u8>, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.subject_alt_names = vec![SanType::URI(format!("spiffe://td/node/{node}").try_into().unwrap())];
        let cert = p.self_signed(&key).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    }

    #[test]
    fn a_kept_certificate_reads_back_for_its_node_only() {
        let dir = std::env::temp_dir().join(format!("hv-agent-identity-{}", std::process::id()));
        let (chain_pem, key_pem) = a_certificate("node-a");
        let issued = super::super::obtain::issued(chain_pem, key_pem, "node-a").unwrap();
        save(&dir, &issued).unwrap();
        let back = load(&dir, "node-a").unwrap();
        assert_eq!(
            (&back.chain_pem, &back.key_pem, back.not_after),
            (&issued.chain_pem, &issued.key_pem, issued.not_after)
        );
        assert!(load(&dir, "node-b").is_none(), "another node's is none of ours");
        let mode = std::fs::metadata(dir.join(FILE)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
        std::fs::write(dir.join(FILE), b"half a file").unwrap();
        assert!(load(&dir, "node-a").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
