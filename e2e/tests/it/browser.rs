//! Real headless Chromium driven over the DevTools protocol (one websocket,
//! flat sessions): start it with a fresh profile directory, open a page,
//! evaluate, click, type, resize, take screenshots and receive downloads.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// Debian's `chromium`.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A Chromium process with one page attached; killed on drop.
pub struct Browser {
    ws: WebSocket<TcpStream>,
    next_id: u64,
    session: String,
    child: Child,
    /// Where downloads land.
    pub downloads: PathBuf,
    _user_data: tempfile::TempDir,
    _download_dir: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long [`Browser::wait_for`] polls by default: generous, the machine
/// is shared with other builds.
pub const WAIT: Duration = Duration::from_secs(60);

impl Browser {
    /// Starts headless Chromium on a fresh user-data directory, with a page
    /// of `width`×`height` CSS pixels and downloads allowed.
    pub fn start(width: u32, height: u32) -> Browser {
        let user_data = tempfile::tempdir().unwrap();
        let download_dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", user_data.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {CHROMIUM}: {e}"));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = Vec::new();
        let url = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("{CHROMIUM} exited before listening: {seen:#?}");
            };
            if let Some(rest) = line.strip_prefix("DevTools listening on ") {
                break rest.trim().to_owned();
            }
            seen.push(line);
        };
        // Keep draining stderr so Chromium never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});

        let hostport = url
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .expect("a ws:// DevTools URL");
        let stream = TcpStream::connect(hostport).expect("connect to DevTools");
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let (ws, _) = tungstenite::client(url.as_str(), stream).expect("DevTools handshake");
        let mut b = Browser {
            ws,
            next_id: 0,
            session: String::new(),
            child,
            downloads: download_dir.path().to_path_buf(),
            _user_data: user_data,
            _download_dir: download_dir,
        };
        let downloads = b.downloads.to_str().unwrap().to_owned();
        b.send(
            None,
            "Browser.setDownloadBehavior",
            json!({"behavior": "allow", "downloadPath": downloads}),
        );
        let target = b.send(None, "Target.createTarget", json!({"url": "about:blank"}));
        let attached = b.send(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        b.resize(width, height);
        b
    }

    /// Sends `method` to the page's session (or the browser when `None`)
    /// and waits for its answer; a protocol error panics naming the method.
    fn send(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send(Message::text(msg.to_string())).unwrap();
        loop {
            let m = self.ws.read().unwrap_or_else(|e| panic!("{method}: {e}"));
            let Message::Text(text) = m else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                if let Some(err) = v.get("error") {
                    panic!("{method}: {err}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Sends `method` to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(&session), method, params)
    }

    /// Sets the page's viewport to `width`×`height` CSS pixels.
    pub fn resize(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
    }

    /// Opens `url`.
    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its
    /// value; a thrown exception panics with it.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("evaluating `{expr}`: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is truthy and returns it; after `timeout`
    /// panics naming it, with `describe_page` (an expression) evaluated.
    pub fn wait_for_within(&mut self, expr: &str, timeout: Duration, describe_page: &str) -> Value {
        let start = Instant::now();
        loop {
            let v = self.eval(expr);
            if !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0)) {
                return v;
            }
            if start.elapsed() > timeout {
                let page = self.eval(describe_page);
                panic!("timed out after {timeout:?} waiting for `{expr}`; the page: {page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A real mouse move to page coordinates.
    pub fn mouse_move(&mut self, x: f64, y: f64) {
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": x, "y": y}),
        );
    }

    /// A real left click at page coordinates.
    pub fn click_at(&mut self, x: f64, y: f64) {
        self.mouse_move(x, y);
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Clicks the centre of the element `selector`, once nothing else
    /// (a tooltip, a panel still laying out) covers that point: a real
    /// click there would otherwise land on whatever is on top.
    pub fn click(&mut self, selector: &str) {
        let start = Instant::now();
        loop {
            let r = self.eval(&format!(
                "(() => {{ const e = document.querySelector({selector:?}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
                 const x = r.left + r.width / 2, y = r.top + r.height / 2; \
                 const top = document.elementFromPoint(x, y); \
                 const hit = !!top && (e.contains(top) || top.contains(e) && top.tagName === 'LABEL'); \
                 return [x, y, hit, top ? top.outerHTML.slice(0, 120) : 'nothing']; }})()"
            ));
            assert!(r.is_array(), "no element {selector} to click");
            if r[2] == json!(true) {
                self.click_at(r[0].as_f64().unwrap(), r[1].as_f64().unwrap());
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{selector} stayed covered by {} for 10 s",
                r[3]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Focuses `selector`, selects its content and types `text` over it
    /// (an empty `text` deletes it).
    pub fn type_into(&mut self, selector: &str, text: &str) {
        self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector:?}); e.focus(); e.select(); }})()"
        ));
        if text.is_empty() {
            for kind in ["keyDown", "keyUp"] {
                self.call(
                    "Input.dispatchKeyEvent",
                    json!({"type": kind, "key": "Backspace", "code": "Backspace", "windowsVirtualKeyCode": 8}),
                );
            }
        } else {
            self.call("Input.insertText", json!({"text": text}));
        }
    }

    /// Picks the option whose value is `value` in the `<select>` `selector`,
    /// as a user would (the change event fires).
    pub fn select(&mut self, selector: &str, value: &str) {
        let ok = self.eval(&format!(
            "(() => {{ const s = document.querySelector({selector:?}); \
             if (![...s.options].some(o => o.value === {value:?})) return false; \
             s.value = {value:?}; s.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()"
        ));
        assert_eq!(ok, json!(true), "{selector} has no option {value}");
    }

    /// The text content of `selector`.
    pub fn text(&mut self, selector: &str) -> String {
        self.eval(&format!(
            "(document.querySelector({selector:?}) || {{}}).textContent"
        ))
        .as_str()
        .unwrap_or_default()
        .to_owned()
    }

    /// Puts `file` into the file input `selector`, as the file picker does.
    pub fn set_file(&mut self, selector: &str, file: &Path) {
        let doc = self.call("DOM.getDocument", json!({}));
        let node = self.call(
            "DOM.querySelector",
            json!({"nodeId": doc["root"]["nodeId"], "selector": selector}),
        );
        self.call(
            "DOM.setFileInputFiles",
            json!({"nodeId": node["nodeId"], "files": [file.to_str().unwrap()]}),
        );
    }

    /// A PNG of the viewport.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .expect("the screenshot is base64")
    }

    /// Waits for a finished download whose name ends in `suffix`.
    pub fn downloaded(&self, suffix: &str) -> PathBuf {
        let start = Instant::now();
        loop {
            let done = std::fs::read_dir(&self.downloads)
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().ends_with(suffix));
            if let Some(f) = done {
                return f;
            }
            assert!(
                start.elapsed() < WAIT,
                "no *{suffix} download appeared in {}",
                self.downloads.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
