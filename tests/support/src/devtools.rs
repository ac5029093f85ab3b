//! A minimal client of Chromium's DevTools protocol, for tests that drive a page whose work
//! is asynchronous (`--dump-dom` returns before it ends): headless Chromium started with a
//! DevTools port, one page target, commands over a WebSocket (RFC 6455, std only: text
//! frames, the client's masked), events kept for the test to read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Headless Chromium with a DevTools port on loopback; killed (and its profile removed) on
/// drop.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    port: u16,
}

impl Browser {
    /// Starts `chromium` headless on about:blank with `args` added, off the network but for
    /// loopback (no background networking, updates or sync).
    pub fn launch(chromium: &Path, args: &[&str]) -> Browser {
        static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let profile = std::env::temp_dir().join(format!("duet-devtools-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let child = Command::new(chromium)
            .args(["--headless=new", "--no-sandbox", "--no-first-run", "--disable-background-networking"])
            .args(["--disable-component-update", "--disable-sync", "--disable-extensions", "--remote-debugging-port=0"])
            .args(args)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", chromium.display()));
        let mut b = Browser { child, profile, port: 0 };
        // Chromium writes the port it chose into the profile's DevToolsActivePort.
        let deadline = Instant::now() + Duration::from_secs(60);
        while b.port == 0 {
            if let Ok(s) = std::fs::read_to_string(b.profile.join("DevToolsActivePort"))
                && let Some(p) = s.lines().next().and_then(|l| l.trim().parse().ok())
            {
                b.port = p;
                break;
            }
            if let Ok(Some(status)) = b.child.try_wait() {
                panic!("Chromium exited before it opened its DevTools port: {status}");
            }
            assert!(Instant::now() < deadline, "Chromium did not open its DevTools port within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        b
    }

    /// A connection to the browser's first page.
    pub fn page(&self) -> DevTools {
        let list: Value =
            serde_json::from_str(&http_get(self.port, "/json/list")).expect("DevTools' target list is JSON");
        let ws = list
            .as_array()
            .and_then(|l| l.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page target in {list}"))
            .to_string();
        DevTools::connect(&ws)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The body of `GET path` from 127.0.0.1:`port` (read to its Content-Length: Chromium keeps
/// the connection open).
fn http_get(port: u16, path: &str) -> String {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to DevTools' HTTP port");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("set a read timeout");
    let mut s = BufReader::new(s);
    write!(s.get_mut(), "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").expect("send");
    let mut length = 0;
    loop {
        let mut line = String::new();
        s.read_line(&mut line).expect("read DevTools' reply");
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().expect("a Content-Length");
        }
    }
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).expect("read DevTools' reply");
    String::from_utf8(body).expect("DevTools' reply is UTF-8")
}

/// One page's DevTools session: commands and the events received so far.
pub struct DevTools {
    stream: BufReader<TcpStream>,
    next_id: u64,
    /// Every event received, in order (`{"method": …, "params": …}`).
    pub events: Vec<Value>,
}

impl DevTools {
    fn connect(url: &str) -> DevTools {
        let rest = url.strip_prefix("ws://").unwrap_or_else(|| panic!("not a ws:// URL: {url}"));
        let (host, path) = rest.split_once('/').expect("a path after the host");
        let stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect to {host}: {e}"));
        let mut stream = BufReader::new(stream);
        write!(
            stream.get_mut(),
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: ZHVldC1kZXZ0b29scy0xMg==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .expect("send the upgrade");
        let mut status = String::new();
        stream.read_line(&mut status).expect("read the upgrade's reply");
        assert!(status.contains(" 101 "), "DevTools refused the WebSocket: {status}");
        loop {
            let mut line = String::new();
            stream.read_line(&mut line).expect("read the upgrade's headers");
            if line.trim().is_empty() {
                break;
            }
        }
        DevTools { stream, next_id: 1, events: Vec::new() }
    }

    /// Sends `method` with `params` and returns its result, keeping the events that arrive
    /// meanwhile; panics on a protocol error or when no answer comes within `timeout`.
    pub fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({ "id": id, "method": method, "params": params }).to_string());
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.receive(deadline);
            if msg["id"] == id {
                if let Some(e) = msg.get("error") {
                    panic!("DevTools {method}: {e}");
                }
                return msg["result"].clone();
            }
            if msg.get("method").is_some() {
                self.events.push(msg);
            }
        }
    }

    /// Waits until an event `method` has arrived (returning it), at most `timeout`.
    pub fn wait_for(&mut self, method: &str, timeout: Duration) -> Value {
        if let Some(e) = self.events.iter().find(|e| e["method"] == method) {
            return e.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.receive(deadline);
            if msg.get("method").is_some() {
                self.events.push(msg.clone());
                if msg["method"] == method {
                    return msg;
                }
            }
        }
    }

    fn send(&mut self, text: &str) {
        let data = text.as_bytes();
        let mut frame = vec![0x81u8];
        match data.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x9eu8, 0x37, 0x5c, 0xa1];
        frame.extend_from_slice(&mask);
        frame.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.stream.get_mut().write_all(&frame).expect("send a DevTools command");
    }

    /// The next message (a text frame, continuations joined), answering pings.
    fn receive(&mut self, deadline: Instant) -> Value {
        let mut message = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no DevTools message in time");
            self.stream.get_mut().set_read_timeout(Some(left)).expect("set a read timeout");
            let mut head = [0u8; 2];
            self.stream.read_exact(&mut head).unwrap_or_else(|e| panic!("reading from DevTools: {e}"));
            let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
            let mut len = u64::from(head[1] & 0x7f);
            if len == 126 {
                let mut b = [0u8; 2];
                self.stream.read_exact(&mut b).expect("frame length");
                len = u64::from(u16::from_be_bytes(b));
            } else if len == 127 {
                let mut b = [0u8; 8];
                self.stream.read_exact(&mut b).expect("frame length");
                len = u64::from_be_bytes(b);
            }
            let mut payload = vec![0u8; len as usize];
            self.stream.read_exact(&mut payload).expect("frame payload");
            match opcode {
                0x8 => panic!("DevTools closed the connection"),
                0x9 => {
                    // Ping: the pong carries its payload back (masked, as a client's must).
                    let mut pong = vec![0x8a, 0x80 | payload.len() as u8, 0, 0, 0, 0];
                    pong.extend_from_slice(&payload);
                    self.stream.get_mut().write_all(&pong).expect("pong");
                }
                0xa => {}
                _ => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return serde_json::from_slice(&message).expect("DevTools messages are JSON");
                    }
                }
            }
        }
    }
}

/// The bytes of standard base64 `text` (DevTools' screenshots).
pub fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &c)| n | value(c) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes_padded_and_unpadded_text() {
        assert_eq!(super::base64_decode("ZHVldA=="), b"duet");
        assert_eq!(super::base64_decode("ZHVldHM"), b"duets");
        assert_eq!(super::base64_decode("ZHVldCEh"), b"duet!!");
    }
}
