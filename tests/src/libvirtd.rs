//! A private libvirtd for tests that kill and restart it (the machines of
//! the test ground must stay up for everybody else). Runs like the ground's
//! own for a fake host: as `nobody`, session mode, TCP on 127.0.0.1, state
//! in a scratch dir, in a UTS namespace named after the host it stands for.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateLibvirtd {
    pub port: u16,
    /// The host name libvirt gives: the Nova host's it stands for.
    hostname: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateLibvirtd {
    /// Start one. Its directory is under /tmp, reachable by `nobody` even
    /// when the checkout is not; `make test-env-down` removes what a crashed
    /// test leaves (`/tmp/hv-libvirt-private-*`).
    pub fn start(_ground: &crate::env::TestEnv, host: &str) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!("hv-libvirt-private-{port}"));
        for sub in ["config", "runtime", "cache", "data", "home"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let conf = format!(
            "listen_tls = 0\nlisten_tcp = 1\ntcp_port = \"{port}\"\nlisten_addr = \"127.0.0.1\"\n\
             auth_tcp = \"none\"\nunix_sock_dir = \"{}\"\n",
            dir.join("runtime").display()
        );
        std::fs::write(dir.join("libvirtd.conf"), conf).map_err(|e| e.to_string())?;
        let status = Command::new("chown")
            .arg("-R")
            .arg("nobody:nogroup")
            .arg(&dir)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err("chown of the private libvirtd dir failed".into());
        }
        let mut me = PrivateLibvirtd { port, hostname: host.to_string(), dir, child: None };
        me.spawn()?;
        Ok(me)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let d = &self.dir;
        // unshare, sh, setpriv and env each exec the next: the child is libvirtd.
        let child = Command::new("unshare")
            .args(["--uts", "sh", "-c", "hostname \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(&self.hostname)
            .args(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "-i"])
            .arg("PATH=/usr/sbin:/usr/bin:/sbin:/bin")
            .arg(format!("HOME={}", d.join("home").display()))
            .arg(format!("XDG_CONFIG_HOME={}", d.join("config").display()))
            .arg(format!("XDG_RUNTIME_DIR={}", d.join("runtime").display()))
            .arg(format!("XDG_CACHE_HOME={}", d.join("cache").display()))
            .arg(format!("XDG_DATA_HOME={}", d.join("data").display()))
            .arg("libvirtd")
            .arg("--listen")
            .arg("-f")
            .arg(d.join("libvirtd.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting libvirtd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("private libvirtd did not listen on {} within 20 s", self.port));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    pub fn test_uri(&self) -> String {
        format!("test+tcp://127.0.0.1:{}/default", self.port)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }
}

impl Drop for PrivateLibvirtd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
