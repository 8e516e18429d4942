//! A headless Chromium driven through chromedriver's W3C WebDriver HTTP API
//! (Debian's `chromium` and `chromium-driver`, installed by `cargo xtask
//! setup`): enough of the protocol to load pages, fill and submit forms,
//! read text and cookies and take screenshots. Everything stays on 127.0.0.1.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::wait_until;

/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process and one browser session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    profile: tempfile::TempDir,
}

/// One element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium
    /// with a fresh profile and no network of its own (no sync, updates or QUIC).
    pub async fn start() -> anyhow::Result<Browser> {
        let port = pushonce::store::free_loopback_port()?;
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "chromedriver is missing: run `cargo xtask setup` (Debian: chromium-driver)",
            )?;
        let profile = tempfile::tempdir()?;
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: reqwest::Client::new(),
            profile,
        };
        let (http, status) = (browser.http.clone(), format!("{}/status", browser.base));
        wait_until(Duration::from_secs(30), || {
            let (http, status) = (http.clone(), status.clone());
            async move { http.get(&status).send().await.is_ok() }
        })
        .await
        .context("chromedriver did not answer within 30 s")?;
        browser.session = browser.new_session().await?;
        Ok(browser)
    }

    async fn new_session(&self) -> anyhow::Result<String> {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1200,900",
            &format!("--user-data-dir={}", self.profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium(), "args": args}
        }}});
        let answer = self.call("POST", "/session", Some(caps)).await?;
        answer["sessionId"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no session id in {answer}"))
    }

    /// One WebDriver command; its `value`.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body.unwrap_or_else(|| json!({}))),
        };
        let answer: Value = request.send().await?.json().await?;
        let value = answer["value"].clone();
        if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
            bail!("webdriver {method} {path}: {error}: {}", value["message"]);
        }
        Ok(value)
    }

    fn at(&self, tail: &str) -> String {
        format!("/session/{}{tail}", self.session)
    }

    /// Loads `url` and waits for it.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.call("POST", &self.at("/url"), Some(json!({"url": url})))
            .await
            .map(|_| ())
    }

    /// The URL of the page shown.
    pub async fn url(&self) -> anyhow::Result<String> {
        let v = self.call("GET", &self.at("/url"), None).await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The visible text of the whole page. A page a click loads may replace
    /// the body between finding it and reading it: read again (within 10 s).
    pub async fn text(&self) -> anyhow::Result<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let read = match self.find("body").await {
                Ok(body) => self.text_of(&body).await,
                Err(e) => Err(e),
            };
            match read {
                Err(e) if is_stale(&e) && std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    /// The first element matching CSS selector `css`.
    pub async fn find(&self, css: &str) -> anyhow::Result<Element> {
        let v = self
            .call(
                "POST",
                &self.at("/element"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .with_context(|| format!("no element {css}"))?;
        v[ELEMENT]
            .as_str()
            .map(|id| Element(id.to_string()))
            .with_context(|| format!("no element id for {css}: {v}"))
    }

    /// The first element matching `css`, waiting up to 10 s for it to
    /// appear (on the page a click loads).
    pub async fn wait_for(&self, css: &str) -> anyhow::Result<Element> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.find(css).await {
                Ok(element) => return Ok(element),
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The text of the element matching `css`.
    pub async fn text_at(&self, css: &str) -> anyhow::Result<String> {
        let element = self.find(css).await?;
        self.text_of(&element).await
    }

    /// Signs in to the console at `base` (`http://…`) as `name` with the
    /// admin token `token`, from its login page.
    pub async fn sign_in(&self, base: &str, name: &str, token: &str) -> anyhow::Result<()> {
        self.goto(&format!("{base}/console/login")).await?;
        self.fill("#name", name).await?;
        self.fill("#token", token).await?;
        self.click("button[type=submit]").await
    }

    /// Types `text` into the element matching `css`.
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let element = self.find(css).await?;
        let path = self.at(&format!("/element/{}/value", element.0));
        self.call("POST", &path, Some(json!({"text": text})))
            .await
            .map(|_| ())
    }

    /// Clicks the element matching `css` (a link or a form's button) and
    /// waits, within 10 s, until the page it loads has replaced this one and
    /// finished loading: chromedriver may answer the click before the
    /// navigation commits.
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let before = self.find("html").await?;
        let element = self.find(css).await?;
        let path = self.at(&format!("/element/{}/click", element.0));
        self.call("POST", &path, None).await?;
        self.wait_replaced(&before)
            .await
            .with_context(|| format!("clicking {css}"))
    }

    /// Waits until `before` (the old page's root) has left the page and the
    /// new document is complete.
    async fn wait_replaced(&self, before: &Element) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let name = self.at(&format!("/element/{}/name", before.0));
        let script = json!({"script": "return document.readyState", "args": []});
        loop {
            // Any error reading the old root (stale, "does not belong to
            // the document", ...) means it left the page; a driver that
            // failed fails the readyState read below.
            let replaced = self.call("GET", &name, None).await.is_err();
            if replaced {
                let state = self
                    .call("POST", &self.at("/execute/sync"), Some(script.clone()))
                    .await?;
                if state == "complete" {
                    return Ok(());
                }
            }
            if std::time::Instant::now() >= deadline {
                bail!("no new page loaded within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The visible text of `element`.
    pub async fn text_of(&self, element: &Element) -> anyhow::Result<String> {
        let v = self
            .call(
                "GET",
                &self.at(&format!("/element/{}/text", element.0)),
                None,
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The cookies the page's origin has, as WebDriver describes them.
    pub async fn cookies(&self) -> anyhow::Result<Vec<Value>> {
        let v = self.call("GET", &self.at("/cookie"), None).await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub async fn script(&self, script: &str) -> anyhow::Result<Value> {
        let body = json!({"script": script, "args": []});
        self.call("POST", &self.at("/execute/sync"), Some(body))
            .await
    }

    /// Resizes the window to `width` x `height` CSS pixels.
    pub async fn resize(&self, width: u32, height: u32) -> anyhow::Result<()> {
        let rect = json!({"width": width, "height": height});
        self.call("POST", &self.at("/window/rect"), Some(rect))
            .await
            .map(|_| ())
    }

    /// Saves a PNG screenshot of the page at `path`.
    pub async fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        use base64::Engine;
        let v = self.call("GET", &self.at("/screenshot"), None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .context("screenshot is not base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }

    /// Ends the session and chromedriver.
    pub async fn stop(mut self) {
        let _ = self.call("DELETE", &self.at(""), None).await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

/// Whether a WebDriver error says the element left the page (a new page loaded).
fn is_stale(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    [
        "stale element",
        "no such element",
        "does not belong to the document",
    ]
    .iter()
    .any(|gone| text.contains(gone))
}

/// The Chromium binary (Debian: `/usr/bin/chromium`).
fn chromium() -> String {
    for candidate in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(candidate).exists() {
            return candidate.to_string();
        }
    }
    "chromium".to_string()
}
