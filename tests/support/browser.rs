//! A real headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`,
//! installed by `scripts/deps`): a tiny client on reqwest for the few commands page tests need
//! (navigate, run a script, take a screenshot), plus one Chrome DevTools command through
//! chromedriver to send Basic credentials with every request. chromedriver and the browser run
//! in their own process group, killed when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use super::server::free_port;

fn binary(var: &str, default: &str) -> PathBuf {
    let p = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/deps` (Debian packages chromium, chromium-driver) \
         or point {var} at it",
        p.display()
    );
    p
}

/// One browser session.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub async fn start() -> Browser {
        let driver_bin = binary("CHROMEDRIVER", "/usr/bin/chromedriver");
        let chromium = binary("CHROMIUM", "/usr/bin/chromium");
        let port = free_port();
        let mut cmd = Command::new(&driver_bin);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let driver = cmd.spawn().expect("start chromedriver");
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let Some(id) = r["value"]["sessionId"].as_str() else {
            panic!("no browser session: {r}");
        };
        Browser {
            driver,
            http,
            session: format!("{base}/session/{id}"),
            _profile: profile,
        }
    }

    async fn command(&self, path: &str, body: Value) -> Value {
        let r: Value = self
            .http
            .post(format!("{}/{path}", self.session))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if r["value"].get("error").is_some() {
            panic!("WebDriver {path}: {r}");
        }
        r["value"].clone()
    }

    /// Sends `Authorization: Basic user:password` with every request of this session.
    pub async fn basic_auth(&self, user: &str, password: &str) {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let cdp = |cmd: &str, params: Value| json!({"cmd": cmd, "params": params});
        self.command("goog/cdp/execute", cdp("Network.enable", json!({})))
            .await;
        let headers = json!({"headers": {"Authorization": format!("Basic {token}")}});
        self.command(
            "goog/cdp/execute",
            cdp("Network.setExtraHTTPHeaders", headers),
        )
        .await;
    }

    /// Navigates to `url` (returns once the page loaded).
    pub async fn goto(&self, url: &str) {
        self.command("url", json!({"url": url})).await;
    }

    /// Runs `script` (a function body; `return` its result) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.command("execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// Writes a PNG screenshot of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let r: Value = self
            .http
            .get(format!("{}/screenshot", self.session))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["value"].as_str().expect("screenshot data"))
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Ends the session (closing the browser).
    pub async fn quit(self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let pgid = self.driver.id() as i32;
        // SAFETY: signalling the process group we created for chromedriver.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.driver.wait();
    }
}
