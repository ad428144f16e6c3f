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
}

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
        match rx.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(OvsdbError::Rpc { method: method.to_string(), error }),
            Err(_) => Err(OvsdbError::Closed),
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
        let mut buf: Vec<u8> = Vec::with_capacity(8192);
        let mut chunk = vec![0u8; 16384];
        loop {
            let n = match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            let mut consumed = 0;
            {
                let mut stream = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                loop {
                    match stream.next() {
                        Some(Ok(msg)) => {
                            consumed = stream.byte_offset();
                            self.dispatch(msg).await;
                        }
                        Some(Err(e)) if e.is_eof() => break,
                        // Garbage on the wire: the stream cannot be resynchronised.
                        Some(Err(_)) => return,
                        None => break,
                    }
                }
            }
            buf.drain(..consumed);
        }
    }

    async fn dispatch(&self, msg: Value) {
        let method = msg.get("method").and_then(Value::as_str).map(str::to_string);
        match method.as_deref() {
            Some("echo") => {
                let reply = json!({"id": msg.get("id").cloned().unwrap_or(Value::Null),
                                   "result": msg.get("params").cloned().unwrap_or(json!([])), "error": null});
                let _ = self.send(&reply).await;
            }
            Some("update") => {
                let params = msg.get("params").and_then(Value::as_array).cloned().unwrap_or_default();
                let id = params.first().and_then(Value::as_str).unwrap_or_default().to_string();
                let updates = params.get(1).cloned().unwrap_or(Value::Null);
                let sender = self.monitors.lock().await.get(&id).cloned();
                if let Some(tx) = sender {
                    let _ = tx.send(updates).await;
                }
            }
            Some(_) => {} // other notifications (locked, stolen) are not used
            None => {
                let Some(id) = msg.get("id").and_then(Value::as_u64) else { return };
                if let Some(tx) = self.pending.lock().await.remove(&id) {
                    let err = msg.get("error").cloned().unwrap_or(Value::Null);
                    let _ = tx.send(if err.is_null() {
                        Ok(msg.get("result").cloned().unwrap_or(Value::Null))
                    } else {
                        Err(err)
                    });
                }
            }
        }
    }
}
