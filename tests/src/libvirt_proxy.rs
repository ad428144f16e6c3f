//! A proxy between an agent and a fake host's libvirtd (plain TCP, the
//! test driver) that makes the host's hypervisor another version: it
//! passes libvirt's RPC through, and rewrites the answer to
//! `virConnectGetVersion`. Every fake host's libvirtd is the same test
//! driver, so this is how the ground has a host with a newer hypervisor
//! than its neighbours (the preflight's OS validation).
//!
//! libvirt's RPC: each message is a 4-byte big-endian length (itself
//! included), a header (program, version, procedure, type, serial,
//! status; 4 bytes each), then the XDR body. The answer to
//! `REMOTE_PROC_CONNECT_GET_VERSION` (procedure 4 of the remote program)
//! is one unsigned hyper: the version as major × 1,000,000 + minor ×
//! 1,000 + micro.
#![allow(clippy::panic)] // test support: a proxy that cannot start fails its test

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const REMOTE_PROGRAM: u32 = 0x2000_8086;
const CONNECT_GET_VERSION: u32 = 4;
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
            rewrite(&mut message, version);
            client_tx.write_all(&len).await?;
            client_tx.write_all(&message).await?;
        }
    };
    let _: Result<((), ()), std::io::Error> = tokio::try_join!(up, down);
}

/// The message after its length: the version answered replaced.
fn rewrite(message: &mut [u8], version: u64) {
    let word = |i: usize| u32::from_be_bytes([message[i], message[i + 1], message[i + 2], message[i + 3]]);
    let header = (word(0), word(8), word(12), word(20));
    if header == (REMOTE_PROGRAM, CONNECT_GET_VERSION, REPLY, OK) && message.len() >= 32 {
        message[24..32].copy_from_slice(&version.to_be_bytes());
    }
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
    fn only_the_version_answer_is_rewritten() {
        let mut answer = message(REMOTE_PROGRAM, CONNECT_GET_VERSION, REPLY, OK, 2);
        rewrite(&mut answer, 9_000_000);
        assert_eq!(answer[24..32], 9_000_000u64.to_be_bytes());
        for (procedure, kind, status) in
            [(3, REPLY, OK), (CONNECT_GET_VERSION, 0, OK), (CONNECT_GET_VERSION, REPLY, 1)]
        {
            let mut other = message(REMOTE_PROGRAM, procedure, kind, status, 2);
            let before = other.clone();
            rewrite(&mut other, 9_000_000);
            assert_eq!(other, before);
        }
    }
}
