//! A proxy between an agent and a fake host's libvirtd (plain TCP, the
//! test driver) that makes the host another machine: it passes libvirt's
//! RPC through, and rewrites the answer to `virConnectGetVersion` (another
//! hypervisor version) and to `virConnectGetCapabilities` (x86_64 guests
//! besides the test driver's i686 ones). Every fake host's libvirtd is the
//! same test driver, so this is how the ground has a host unlike its
//! neighbours (the preflight's OS validation).
//!
//! libvirt's RPC: each message is a 4-byte big-endian length (itself
//! included), a header (program, version, procedure, type, serial,
//! status; 4 bytes each), then the XDR body. The answer to
//! `REMOTE_PROC_CONNECT_GET_VERSION` (procedure 4 of the remote program)
//! is one unsigned hyper: the version as major × 1,000,000 + minor ×
//! 1,000 + micro; to `REMOTE_PROC_CONNECT_GET_CAPABILITIES` (7), one XDR
//! string (its length, its bytes, padded to 4).
#![allow(clippy::panic)] // test support: a proxy that cannot start fails its test

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REMOTE_PROGRAM: u32 = 0x2000_8086;
const CONNECT_GET_VERSION: u32 = 4;
const CONNECT_GET_CAPABILITIES: u32 = 7;
/// What the capabilities gain: a guest of another architecture.
const X86_64_GUEST: &str = "<guest><os_type>hvm</os_type><arch name='x86_64'><wordsize>64</wordsize>\
                            <domain type='test'/></arch></guest>";
const REPLY: u32 = 1;
const OK: u32 = 0;
/// Longest message passed on (libvirt's own limit is 32 MiB).
const MAX_MESSAGE: usize = 32 << 20;

pub struct VersionProxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl VersionProxy {
    /// Proxies to `upstream` (`127.0.0.1:PORT`), answering `version`
    /// (libvirt's number: 9000000 for 9.0.0) to every version asked.
    pub async fn start(upstream: &str, version: u64) -> VersionProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("proxy: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("proxy: {e}"));
        let upstream = upstream.to_string();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, version).await;
                    }
                });
            }
        });
        VersionProxy { port, task }
    }

    /// A test-driver URI through the proxy.
    pub fn uri(&self) -> String {
        format!("test+tcp://127.0.0.1:{}/default", self.port)
    }
}

impl Drop for VersionProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, version: u64) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = async { tokio::io::copy(&mut client_rx, &mut server_tx).await.map(|_| ()) };
    let down = async {
        loop {
            let mut len = [0u8; 4];
            server_rx.read_exact(&mut len).await?;
            let n = u32::from_be_bytes(len) as usize;
            if !(28..=MAX_MESSAGE).contains(&n) {
                return Err(std::io::Error::other(format!("libvirt message of {n} bytes")));
            }
            let mut message = vec![0u8; n - 4];
            server_rx.read_exact(&mut message).await?;
            let message = rewrite(message, version);
            let len = u32::try_from(message.len() + 4).unwrap_or(u32::MAX).to_be_bytes();
            client_tx.write_all(&len).await?;
            client_tx.write_all(&message).await?;
        }
    };
    let _: Result<((), ()), std::io::Error> = tokio::try_join!(up, down);
}

/// The message after its length, the version answered replaced and an
/// x86_64 guest added to the capabilities.
fn rewrite(mut message: Vec<u8>, version: u64) -> Vec<u8> {
    let word = |m: &[u8], i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let (program, procedure, kind, status) =
        (word(&message, 0), word(&message, 8), word(&message, 12), word(&message, 20));
    if (program, kind, status) != (REMOTE_PROGRAM, REPLY, OK) {
        return message;
    }
    if procedure == CONNECT_GET_VERSION && message.len() >= 32 {
        message[24..32].copy_from_slice(&version.to_be_bytes());
    }
    if procedure == CONNECT_GET_CAPABILITIES && message.len() >= 28 {
        let n = word(&message, 24) as usize;
        let Some(xml) = message.get(28..28 + n).and_then(|b| std::str::from_utf8(b).ok()) else {
            return message;
        };
        let xml = xml.replacen("</capabilities>", &format!("{X86_64_GUEST}</capabilities>"), 1);
        let mut out = message[..24].to_vec();
        out.extend(u32::try_from(xml.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend(xml.as_bytes());
        out.resize(out.len() + (4 - xml.len() % 4) % 4, 0);
        return out;
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(program: u32, procedure: u32, kind: u32, status: u32, body: u64) -> Vec<u8> {
        [program, 1, procedure, kind, 7, status]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .chain(body.to_be_bytes())
            .collect()
    }

    #[test]
    fn only_the_version_and_capabilities_answers_are_rewritten() {
        let answer = message(REMOTE_PROGRAM, CONNECT_GET_VERSION, REPLY, OK, 2);
        assert_eq!(rewrite(answer, 9_000_000)[24..32], 9_000_000u64.to_be_bytes());
        for (procedure, kind, status) in
            [(3, REPLY, OK), (CONNECT_GET_VERSION, 0, OK), (CONNECT_GET_VERSION, REPLY, 1)]
        {
            let other = message(REMOTE_PROGRAM, procedure, kind, status, 2);
            assert_eq!(rewrite(other.clone(), 9_000_000), other);
        }
        let xml = "<capabilities><host/></capabilities>";
        let mut caps: Vec<u8> = [REMOTE_PROGRAM, 1, CONNECT_GET_CAPABILITIES, REPLY, 7, OK]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        caps.extend(u32::try_from(xml.len()).unwrap_or(0).to_be_bytes());
        caps.extend(xml.as_bytes());
        caps.resize(caps.len() + (4 - xml.len() % 4) % 4, 0);
        let out = rewrite(caps, 9_000_000);
        let n = u32::from_be_bytes([out[24], out[25], out[26], out[27]]) as usize;
        let text = std::str::from_utf8(&out[28..28 + n]).unwrap_or_default();
        assert!(text.ends_with(&format!("{X86_64_GUEST}</capabilities>")), "{text}");
        assert_eq!(out.len() % 4, 0, "padded to 4");
    }
}
