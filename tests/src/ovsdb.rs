//! One-shot OVSDB (RFC 7047) JSON-RPC over TCP, for checking the ground.
//! The agent's long-lived client is a different thing (`agent/src/ovsdb/`).

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends one request and returns the `result` of its reply.
pub async fn call(host: &str, port: u16, method: &str, params: Value) -> std::io::Result<Value> {
    let mut stream = TcpStream::connect((host, port)).await?;
    let req = json!({"method": method, "params": params, "id": 1});
    stream.write_all(req.to_string().as_bytes()).await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "ovsdb closed the connection",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut values = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
        if let Some(Ok(reply)) = values.next() {
            if let Some(err) = reply.get("error").filter(|e| !e.is_null()) {
                return Err(std::io::Error::other(format!("ovsdb error: {err}")));
            }
            return Ok(reply.get("result").cloned().unwrap_or(Value::Null));
        }
    }
}
