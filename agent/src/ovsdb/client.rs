//! A long-lived OVSDB JSON-RPC client (RFC 7047) over TCP or a unix socket.
//!
//! Why our own: the published crates cannot hold a connection (one panics
//! on any request the server sends, another cannot answer the server's
//! `echo` inactivity probe and is dropped after ~10 s idle). This one
//! stream-parses the concatenated JSON values the server sends, matches
//! replies to requests by id, answers `echo` from the reader task (so a
//! busy caller never gets the connection dropped), and forwards monitor
//! `update` notifications.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, mpsc, oneshot};

#[derive(Debug, thiserror::Error)]
pub enum OvsdbError {
    #[error("connecting to OVSDB at {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("OVSDB remote {0:?} is neither tcp:HOST:PORT nor unix:PATH")]
    BadRemote(String),
    #[error("the OVSDB connection is closed")]
    Closed,
    #[error("writing to OVSDB: {0}")]
    Write(std::io::Error),
    #[error("OVSDB answered {method} with an error: {error}")]
    Rpc { method: String, error: Value },
    #[error("OVSDB transaction failed: {0}")]
    Transaction(Value),
    #[error("OVSDB did not answer {method} within {secs} s")]
    Timeout { method: String, secs: u64 },
}

/// How long a request waits for its reply: a connection that stays open but
/// never answers must not hang a check or a watcher.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>>;
type Writer = Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

/// A connected client. Cheap to clone; all clones share the connection.
#[derive(Clone)]
pub struct Client {
    writer: Writer,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    monitors: Arc<Mutex<HashMap<String, mpsc::Sender<Value>>>>,
    closed: Arc<tokio::sync::watch::Receiver<bool>>,
}

impl Client {
    /// `tcp:127.0.0.1:6640` or `unix:/run/openvswitch/db.sock`.
    pub async fn connect(remote: &str) -> Result<Client, OvsdbError> {
        let (reader, writer): (Box<dyn AsyncRead + Send + Unpin>, Box<dyn AsyncWrite + Send + Unpin>) =
            if let Some(addr) = remote.strip_prefix("tcp:") {
                let s = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| OvsdbError::Connect(remote.to_string(), e))?;
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            } else if let Some(path) = remote.strip_prefix("unix:") {
                let s = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| OvsdbError::Connect(remote.to_string(), e))?;
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            } else {
                return Err(OvsdbError::BadRemote(remote.to_string()));
            };
        let (closed_tx, closed_rx) = tokio::sync::watch::channel(false);
        let client = Client {
            writer: Arc::new(Mutex::new(writer)),
            pending: Arc::new(Mutex::new(HashMap::new())),
            next_id: Arc::new(AtomicU64::new(1)),
            monitors: Arc::new(Mutex::new(HashMap::new())),
            closed: Arc::new(closed_rx),
        };
        let c = client.clone();
        tokio::spawn(async move {
            c.read_loop(reader).await;
            // Fail everything still waiting, so no caller hangs.
            c.pending.lock().await.clear();
            c.monitors.lock().await.clear();
            let _ = closed_tx.send(true);
        });
        Ok(client)
    }

    /// True once the connection is gone (the caller reconnects).
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        let mut rx = (*self.closed).clone();
        while !*rx.borrow() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn send(&self, msg: &Value) -> Result<(), OvsdbError> {
        let mut w = self.writer.lock().await;
        w.write_all(msg.to_string().as_bytes()).await.map_err(OvsdbError::Write)?;
        w.flush().await.map_err(OvsdbError::Write)
    }

    /// Send a request and wait for its reply's `result`.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, OvsdbError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().await.insert(id, tx);
        self.send(&json!({"method": method, "params": params, "id": id})).await?;
        match tokio::time::timeout(CALL_TIMEOUT, rx).await {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(error))) => Err(OvsdbError::Rpc { method: method.to_string(), error }),
            Ok(Err(_)) => Err(OvsdbError::Closed),
            Err(_) => {
                self.pending.lock().await.remove(&id);
                Err(OvsdbError::Timeout { method: method.to_string(), secs: CALL_TIMEOUT.as_secs() })
            }
        }
    }

    pub async fn list_dbs(&self) -> Result<Vec<String>, OvsdbError> {
        let v = self.call("list_dbs", json!([])).await?;
        Ok(v.as_array()
            .map(|a| a.iter().filter_map(|d| d.as_str().map(str::to_string)).collect())
            .unwrap_or_default())
    }

    /// Run a transaction; any failed operation is an error.
    pub async fn transact(&self, db: &str, ops: Vec<Value>) -> Result<Vec<Value>, OvsdbError> {
        let mut params = vec![json!(db)];
        params.extend(ops);
        let v = self.call("transact", Value::Array(params)).await?;
        let results = v.as_array().cloned().unwrap_or_default();
        if let Some(err) = results.iter().find(|r| r.get("error").is_some_and(|e| !e.is_null())) {
            return Err(OvsdbError::Transaction(err.clone()));
        }
        Ok(results)
    }

    /// Start a monitor; returns the initial contents and a channel of
    /// `table-updates` objects.
    pub async fn monitor(
        &self,
        db: &str,
        monitor_id: &str,
        requests: Value,
    ) -> Result<(Value, mpsc::Receiver<Value>), OvsdbError> {
        let (tx, rx) = mpsc::channel(64);
        self.monitors.lock().await.insert(monitor_id.to_string(), tx);
        let initial = self.call("monitor", json!([db, monitor_id, requests])).await?;
        Ok((initial, rx))
    }

    async fn read_loop(&self, mut reader: Box<dyn AsyncRead + Send + Unpin>) {
        let mut decoder = Decoder::default();
        let mut chunk = vec![0u8; 16384];
        loop {
            let n = match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Garbage on the wire: the stream cannot be resynchronised.
            let Ok(messages) = decoder.feed(&chunk[..n]) else { return };
            for msg in messages {
                self.dispatch(msg).await;
            }
        }
    }

    async fn dispatch(&self, msg: Value) {
        match Incoming::of(msg) {
            Incoming::Echo(reply) => {
                let _ = self.send(&reply).await;
            }
            Incoming::Update { monitor, updates } => {
                let sender = self.monitors.lock().await.get(&monitor).cloned();
                if let Some(tx) = sender {
                    let _ = tx.send(updates).await;
                }
            }
            Incoming::Reply { id, outcome } => {
                if let Some(tx) = self.pending.lock().await.remove(&id) {
                    let _ = tx.send(outcome);
                }
            }
            Incoming::Ignored => {}
        }
    }
}

/// Splits the bytes an OVSDB server sends into JSON values: they arrive
/// concatenated, with no framing, and may be cut anywhere. Each byte is
/// scanned once (nesting depth and strings tracked across feeds) and each
/// value parsed once it is closed, so a large message arriving in many
/// small reads costs linear time. Pure (fuzzed).
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// How far `buf` has been scanned.
    scanned: usize,
    /// Open objects and arrays at `scanned`.
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// The stream holds something that is not JSON: it cannot be resynchronised.
#[derive(Debug, PartialEq, Eq)]
pub struct Garbage;

impl Decoder {
    /// Most a single message may take while it is incomplete; a server that
    /// sends more without closing a value is not speaking OVSDB.
    pub const MAX_PENDING: usize = 64 << 20;

    /// Takes `bytes`; answers every value now complete, in order. A value
    /// on the wire is an object or an array (JSON-RPC's messages).
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Value>, Garbage> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while self.scanned < self.buf.len() {
            let b = self.buf[self.scanned];
            self.scanned += 1;
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' if self.depth > 0 => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.checked_sub(1).ok_or(Garbage)?;
                    if self.depth == 0 {
                        let value =
                            serde_json::from_slice(&self.buf[start..self.scanned]).map_err(|_| Garbage)?;
                        out.push(value);
                        start = self.scanned;
                    }
                }
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ if self.depth == 0 => return Err(Garbage),
                _ => {}
            }
        }
        self.buf.drain(..start);
        self.scanned -= start;
        if self.buf.len() > Self::MAX_PENDING {
            return Err(Garbage);
        }
        Ok(out)
    }
}

/// What one message from the server means to the client. Pure (fuzzed).
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// The server's inactivity probe; this is the answer to send.
    Echo(Value),
    /// A monitor's `update` notification.
    Update { monitor: String, updates: Value },
    /// The reply to request `id`.
    Reply { id: u64, outcome: Result<Value, Value> },
    /// Anything else (other notifications, a reply without a usable id).
    Ignored,
}

impl Incoming {
    pub fn of(msg: Value) -> Incoming {
        match msg.get("method").and_then(Value::as_str) {
            Some("echo") => Incoming::Echo(json!({
                "id": msg.get("id").cloned().unwrap_or(Value::Null),
                "result": msg.get("params").cloned().unwrap_or(json!([])),
                "error": null,
            })),
            Some("update") => {
                let params = msg.get("params").and_then(Value::as_array).cloned().unwrap_or_default();
                let monitor = params.first().and_then(Value::as_str).unwrap_or_default().to_string();
                Incoming::Update { monitor, updates: params.get(1).cloned().unwrap_or(Value::Null) }
            }
            Some(_) => Incoming::Ignored,
            None => {
                let Some(id) = msg.get("id").and_then(Value::as_u64) else { return Incoming::Ignored };
                let err = msg.get("error").cloned().unwrap_or(Value::Null);
                let outcome = if err.is_null() {
                    Ok(msg.get("result").cloned().unwrap_or(Value::Null))
                } else {
                    Err(err)
                };
                Incoming::Reply { id, outcome }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_and_quotes_inside_strings_do_not_end_a_value() {
        let wire = br#"{"a":"}\"]{","b":[1,{"c":"\\"}]} [2]"#;
        for cut in 0..=wire.len() {
            let mut d = Decoder::default();
            let mut got = d.feed(&wire[..cut]).unwrap_or_else(|_| panic!("cut at {cut}"));
            got.extend(d.feed(&wire[cut..]).unwrap_or_else(|_| panic!("cut at {cut}")));
            assert_eq!(got, vec![json!({"a": "}\"]{", "b": [1, {"c": "\\"}]}), json!([2])], "cut at {cut}");
        }
        assert_eq!(Decoder::default().feed(b"]"), Err(Garbage));
        assert_eq!(Decoder::default().feed(b"42 "), Err(Garbage), "a bare scalar is not a message");
    }

    #[test]
    fn a_large_message_in_small_reads_is_reassembled() {
        // About 3 MiB in 4 KiB reads (a bridge with 100 000 ports).
        let rows: Vec<Value> =
            (0..100_000).map(|i| json!({"name": format!("port-{i:06}"), "ofport": i})).collect();
        let wire = serde_json::to_vec(&json!({"id": 1, "result": [{"rows": rows}]})).unwrap_or_default();
        assert!(wire.len() > 2 << 20);
        let mut d = Decoder::default();
        let mut got = Vec::new();
        for chunk in wire.chunks(4096) {
            got.extend(d.feed(chunk).unwrap_or_default());
        }
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["result"][0]["rows"][99_999]["name"], "port-099999");
    }
}
