//! libvirt domain lifecycle events and the connection-closed callback.
//!
//! `virt` 0.5 has no safe wrapper for either, so this module calls
//! `virt::sys` directly. It is the only place in the agent with `unsafe`.
//!
//! Safety argument:
//! - The default event loop is registered once per process
//!   ([`init_event_loop`]) before any connection that wants events is
//!   opened, and a dedicated thread runs `virEventRunDefaultImpl` forever:
//!   libvirt requires both for callbacks and keepalive to work.
//! - Each registration passes a `Box<Sink>` turned into a raw pointer as the
//!   callback's opaque data, together with a free callback that turns it
//!   back into a `Box` and drops it. libvirt calls the free callback exactly
//!   once, after the last invocation of the callback, when the registration
//!   is removed or the connection is closed; until then the pointer is only
//!   read (`&*`), never freed or mutated, and `Sink` is `Sync`.
//! - The callbacks only read from the `virDomainPtr` libvirt lends them for
//!   the duration of the call (`virDomainGetUUIDString` into a stack buffer
//!   of `VIR_UUID_STRING_BUFLEN` bytes, `virDomainGetName` whose result is
//!   owned by the domain and copied before returning), never keep it, and
//!   never unwind (no panicking code runs inside them).
//! - The lifecycle callback has the `virConnectDomainEventCallback`
//!   signature and is registered through `virConnectDomainEventRegisterAny`
//!   with the generic type, exactly as libvirt's `VIR_DOMAIN_EVENT_CALLBACK`
//!   macro does; libvirt calls it back with the full signature for
//!   `VIR_DOMAIN_EVENT_ID_LIFECYCLE`.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use hv_proto::v1::DomainEventKind;
use tokio::sync::mpsc::UnboundedSender;
use virt::connect::Connect;
use virt::sys;

/// What the callbacks report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LibvirtEvent {
    Domain {
        uuid: String,
        name: String,
        kind: DomainEventKind,
        reason: String,
    },
    /// The connection to libvirtd is gone (daemon restarted, network, keepalive).
    Closed {
        reason: String,
    },
}

struct Sink(UnboundedSender<LibvirtEvent>);

static EVENT_LOOP: OnceLock<Result<(), String>> = OnceLock::new();

/// Register libvirt's default event loop and run it on a thread of its own.
/// Idempotent; must run before opening connections that use events.
pub fn init_event_loop() -> Result<(), String> {
    EVENT_LOOP
        .get_or_init(|| {
            virt::event::event_register_default_impl().map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("libvirt-events".into())
                .spawn(|| {
                    loop {
                        if virt::event::event_run_default_impl().is_err() {
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                    }
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// A live registration; deregistered on drop.
pub struct Subscription {
    conn: Connect,
    callback_id: c_int,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // SAFETY: the pointer comes from a live `Connect` we own a reference
        // to; deregistering an id twice or on a dead connection only
        // returns an error.
        unsafe {
            sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), self.callback_id);
            sys::virConnectUnregisterCloseCallback(self.conn.as_ptr(), Some(close_cb));
        }
    }
}

/// Subscribe `conn` to domain lifecycle events and to its own closing.
pub fn subscribe(conn: &Connect, tx: UnboundedSender<LibvirtEvent>) -> Result<Subscription, String> {
    init_event_loop()?;
    let lifecycle = Box::into_raw(Box::new(Sink(tx.clone()))) as *mut c_void;
    type Lifecycle =
        unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void) -> c_int;
    type Generic = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);
    // SAFETY: see the module doc: the callback is called with the lifecycle
    // signature for VIR_DOMAIN_EVENT_ID_LIFECYCLE; `lifecycle` is freed by
    // `free_sink`, once, by libvirt.
    let id = unsafe {
        let generic = std::mem::transmute::<Lifecycle, Generic>(lifecycle_cb);
        sys::virConnectDomainEventRegisterAny(
            conn.as_ptr(),
            std::ptr::null_mut(),
            sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as c_int,
            Some(generic),
            lifecycle,
            Some(free_sink),
        )
    };
    if id < 0 {
        // SAFETY: registration failed, so libvirt did not take ownership.
        unsafe { drop(Box::from_raw(lifecycle as *mut Sink)) };
        return Err("virConnectDomainEventRegisterAny failed".into());
    }
    let closing = Box::into_raw(Box::new(Sink(tx))) as *mut c_void;
    // SAFETY: as above, for the close callback.
    let rc = unsafe {
        sys::virConnectRegisterCloseCallback(conn.as_ptr(), Some(close_cb), closing, Some(free_sink))
    };
    if rc < 0 {
        // SAFETY: not registered, so still ours.
        unsafe {
            drop(Box::from_raw(closing as *mut Sink));
            sys::virConnectDomainEventDeregisterAny(conn.as_ptr(), id);
        }
        return Err("virConnectRegisterCloseCallback failed".into());
    }
    Ok(Subscription { conn: conn.clone(), callback_id: id })
}

unsafe extern "C" fn free_sink(opaque: *mut c_void) {
    if !opaque.is_null() {
        // SAFETY: `opaque` came from `Box::into_raw(Box<Sink>)` in `subscribe`
        // and libvirt calls this exactly once.
        unsafe { drop(Box::from_raw(opaque as *mut Sink)) };
    }
}

unsafe extern "C" fn lifecycle_cb(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int {
    if opaque.is_null() || dom.is_null() {
        return 0;
    }
    let Some((kind, reason)) = classify(event, detail) else { return 0 };
    // SAFETY: see the module doc.
    let sink = unsafe { &*(opaque as *const Sink) };
    let mut buf = [0 as c_char; sys::VIR_UUID_STRING_BUFLEN as usize];
    // SAFETY: `buf` holds VIR_UUID_STRING_BUFLEN bytes as the call requires.
    let uuid = if unsafe { sys::virDomainGetUUIDString(dom, buf.as_mut_ptr()) } == 0 {
        // SAFETY: on success libvirt wrote a NUL-terminated string into `buf`.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    } else {
        String::new()
    };
    // SAFETY: the name is owned by `dom`, valid during this call; copied.
    let name_ptr = unsafe { sys::virDomainGetName(dom) };
    let name = if name_ptr.is_null() {
        String::new()
    } else {
        // SAFETY: non-null, NUL-terminated, owned by `dom`.
        unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned()
    };
    let _ = sink.0.send(LibvirtEvent::Domain { uuid, name, kind, reason: reason.to_string() });
    0
}

unsafe extern "C" fn close_cb(_conn: sys::virConnectPtr, reason: c_int, opaque: *mut c_void) {
    if opaque.is_null() {
        return;
    }
    // SAFETY: see the module doc.
    let sink = unsafe { &*(opaque as *const Sink) };
    let reason = match reason as u32 {
        sys::VIR_CONNECT_CLOSE_REASON_ERROR => "error",
        sys::VIR_CONNECT_CLOSE_REASON_EOF => "eof (libvirtd closed the connection)",
        sys::VIR_CONNECT_CLOSE_REASON_KEEPALIVE => "keepalive timeout",
        sys::VIR_CONNECT_CLOSE_REASON_CLIENT => "closed by the client",
        _ => "unknown",
    };
    let _ = sink.0.send(LibvirtEvent::Closed { reason: reason.to_string() });
}

/// A lifecycle event and its detail, as the protocol's kind and a reason.
/// `None` for events nobody acts on (a guest-initiated shutdown in progress
/// is followed by STOPPED).
pub fn classify(event: c_int, detail: c_int) -> Option<(DomainEventKind, &'static str)> {
    let (e, d) = (event as u32, detail as u32);
    use DomainEventKind as K;
    Some(match e {
        sys::VIR_DOMAIN_EVENT_DEFINED => {
            (K::Defined, pick(d, &["added", "updated", "renamed", "from-snapshot"]))
        }
        sys::VIR_DOMAIN_EVENT_UNDEFINED => (K::Undefined, pick(d, &["removed", "renamed"])),
        sys::VIR_DOMAIN_EVENT_STARTED if d == sys::VIR_DOMAIN_EVENT_STARTED_MIGRATED => {
            (K::MigratedIn, "migrated")
        }
        sys::VIR_DOMAIN_EVENT_STARTED => {
            (K::Started, pick(d, &["booted", "migrated", "restored", "from-snapshot", "wakeup", "recreated"]))
        }
        sys::VIR_DOMAIN_EVENT_SUSPENDED => (
            K::Suspended,
            pick(
                d,
                &[
                    "paused",
                    "migrated",
                    "io-error",
                    "watchdog",
                    "restored",
                    "from-snapshot",
                    "api-error",
                    "postcopy",
                    "postcopy-failed",
                    "guest-shutdown",
                ],
            ),
        ),
        sys::VIR_DOMAIN_EVENT_RESUMED => {
            (K::Resumed, pick(d, &["unpaused", "migrated", "from-snapshot", "postcopy", "postcopy-failed"]))
        }
        sys::VIR_DOMAIN_EVENT_STOPPED if d == sys::VIR_DOMAIN_EVENT_STOPPED_MIGRATED => {
            (K::MigratedOut, "migrated")
        }
        sys::VIR_DOMAIN_EVENT_STOPPED if d == sys::VIR_DOMAIN_EVENT_STOPPED_CRASHED => {
            (K::Crashed, "crashed")
        }
        sys::VIR_DOMAIN_EVENT_STOPPED => (
            K::Stopped,
            pick(
                d,
                &[
                    "shutdown",
                    "destroyed",
                    "crashed",
                    "migrated",
                    "saved",
                    "failed",
                    "from-snapshot",
                    "recreated",
                ],
            ),
        ),
        sys::VIR_DOMAIN_EVENT_PMSUSPENDED => (K::Suspended, pick(d, &["pm-memory", "pm-disk"])),
        sys::VIR_DOMAIN_EVENT_CRASHED => (K::Crashed, pick(d, &["panicked", "crashloaded"])),
        _ => return None,
    })
}

fn pick(detail: u32, names: &[&'static str]) -> &'static str {
    names.get(detail as usize).copied().unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_map_to_kinds_and_reasons() {
        let c = |e: u32, d: u32| classify(e as c_int, d as c_int);
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_STARTED, 0), Some((DomainEventKind::Started, "booted")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_STARTED, 1), Some((DomainEventKind::MigratedIn, "migrated")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_STOPPED, 1), Some((DomainEventKind::Stopped, "destroyed")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_STOPPED, 3), Some((DomainEventKind::MigratedOut, "migrated")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_STOPPED, 2), Some((DomainEventKind::Crashed, "crashed")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_SUSPENDED, 2), Some((DomainEventKind::Suspended, "io-error")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_SUSPENDED, 3), Some((DomainEventKind::Suspended, "watchdog")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_SUSPENDED, 99), Some((DomainEventKind::Suspended, "unknown")));
        assert_eq!(c(sys::VIR_DOMAIN_EVENT_SHUTDOWN, 0), None);
        assert_eq!(classify(-1, -1), None);
    }
}
