//! A `flm serve` process on 127.0.0.1 (any free port) and a small blocking client for it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;

use crate::common::flm_command;

pub use crate::chat_model::data;

/// The llama2.c reference of stories260K: greedy from BOS, 200 steps (llama2.c
/// `test_all.py` and HF transformers; see tests/data/SOURCES.md).
pub struct Reference {
    /// The 200 generated ids.
    pub ids: Vec<u32>,
    /// Their text.
    pub text: String,
}

/// Reads the reference.
pub fn reference() -> Reference {
    let file = std::fs::read(data("stories260K/stories260K_reference.json")).unwrap();
    let json: Value = serde_json::from_slice(&file).unwrap();
    let greedy = &json["greedy_from_bos"];
    Reference {
        ids: serde_json::from_value(greedy["output_ids"].clone()).unwrap(),
        text: greedy["output_text"].as_str().unwrap().to_owned(),
    }
}

/// The cores the servers of this binary's tests share (the tests run in parallel): how many
/// servers run, and whether one runs alone ([`Server::start_alone`], for a test that
/// measures pace, started once no other runs). Another server may start while one waits
/// to run alone, so that a test that holds one server and starts a second never waits on
/// it.
static CORES: Mutex<(usize, bool)> = Mutex::new((0, false));
static CORES_CHANGED: Condvar = Condvar::new();

/// A server's hold on [`CORES`], given back when it is dropped (after the process is
/// killed).
struct Cores {
    alone: bool,
}

impl Cores {
    fn take(alone: bool) -> Cores {
        let mut cores = CORES.lock().unwrap_or_else(PoisonError::into_inner);
        while cores.1 || (alone && cores.0 > 0) {
            cores = CORES_CHANGED
                .wait(cores)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if alone {
            cores.1 = true;
        } else {
            cores.0 += 1;
        }
        Cores { alone }
    }
}

impl Drop for Cores {
    fn drop(&mut self) {
        let mut cores = CORES.lock().unwrap_or_else(PoisonError::into_inner);
        if self.alone {
            cores.1 = false;
        } else {
            cores.0 -= 1;
        }
        CORES_CHANGED.notify_all();
    }
}

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    agent: ureq::Agent,
    /// What the server wrote on stderr so far (its request log), read by a thread of its
    /// own so that the pipe never fills; printed when a test fails.
    stderr: Arc<Mutex<String>>,
    _cores: Cores,
}

impl Server {
    /// Starts `flm serve` on stories260K with `extra` arguments and waits until it listens.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_model(&data("stories260K/stories260K.bin"), extra)
    }

    /// As [`Server::start`], once no other test's server runs, and none starts until this
    /// one is dropped: for a test that measures time.
    pub fn start_alone(extra: &[&str]) -> Server {
        let cores = Cores::take(true);
        Server::launch(&data("stories260K/stories260K.bin"), extra, cores)
    }

    /// Starts `flm serve` on `model` with `extra` arguments and waits until it listens.
    pub fn start_model(model: &Path, extra: &[&str]) -> Server {
        let cores = Cores::take(false);
        Server::launch(model, extra, cores)
    }

    fn launch(model: &Path, extra: &[&str], cores: Cores) -> Server {
        let mut child = flm_command()
            .args(["serve", "--model", model.to_str().unwrap(), "--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("flm serve starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (mut pipe, sink) = (child.stderr.take().unwrap(), Arc::clone(&stderr));
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                let text = String::from_utf8_lossy(&chunk[..n]);
                sink.lock().unwrap().push_str(&text);
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("flm serve exited before listening")
                .unwrap();
            if let Some(address) = line.strip_prefix("flm serve: listening on ") {
                break address.to_owned();
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        Server {
            child,
            url,
            agent,
            stderr,
            _cores: cores,
        }
    }

    /// What the server has written on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// GET `path`: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        let mut response = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap();
        let body = response.body_mut().read_to_string().unwrap();
        (response.status().as_u16(), body)
    }

    /// POST `body` (raw bytes, as JSON) to `path`: the status and the body as JSON.
    pub fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let mut response = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body)
            .unwrap();
        let json = response.body_mut().read_json().unwrap();
        (response.status().as_u16(), json)
    }

    /// POST to `path` a JSON body that declares `len` bytes (`Content-Length`) and sends
    /// its first 4 MiB at most (from a thread of its own, which stops at the first write
    /// error), over a connection of its own: the status and the body of the answer, which
    /// must come without the rest.
    pub fn post_declared(&self, path: &str, len: usize) -> (u16, Value) {
        let address = self.url.strip_prefix("http://").unwrap();
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n{{\"prompt\": \""
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut writer = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![b'a'; 64 << 10];
            for _ in 0..(len.min(4 << 20) / chunk.len()) {
                if writer.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        read_answer(&mut stream).expect("the connection closed without a whole answer")
    }

    /// POST the JSON `body` to `path`.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, &body.to_string())
    }

    /// POST a streamed request: the JSON of every `data:` event before `data: [DONE]`,
    /// which must end the stream.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let response = self
            .agent
            .post(format!("{}{path}", self.url))
            .send_json(body)
            .unwrap();
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert_eq!(content_type, "text/event-stream");
        let mut text = String::new();
        response
            .into_body()
            .into_reader()
            .read_to_string(&mut text)
            .unwrap();
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("only data events"))
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    /// The value of the metric sample `name` (with its labels, if any) in `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    }
}

/// Reads one HTTP answer with a JSON body from `stream`: its status and body, or `None` when
/// the connection closes before the whole answer.
pub fn read_answer(stream: &mut impl Read) -> Option<(u16, Value)> {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .expect("a Content-Length header")
            .parse::<usize>()
            .unwrap();
        if body.len() >= length {
            let status = head.split(' ').nth(1).unwrap().parse().unwrap();
            return Some((status, serde_json::from_str(&body[..length]).unwrap()));
        }
    }
}

impl Server {
    /// The server process's resident memory in bytes (`/proc/PID/statm`, 4 KiB pages).
    pub fn resident_bytes(&self) -> u64 {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.child.id())).unwrap();
        let pages: u64 = statm.split(' ').nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        self.url.strip_prefix("http://").unwrap()
    }

    /// Sends SIGTERM and waits (a minute at most) for the process to exit: how long it took
    /// and whether it exited with status 0.
    #[cfg(unix)]
    pub fn terminate(&mut self) -> (Duration, bool) {
        let sent = std::time::Instant::now();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (sent.elapsed(), status.success());
            }
            assert!(
                sent.elapsed() < Duration::from_secs(60),
                "flm serve still runs a minute after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("flm serve's stderr:\n{}", self.stderr());
        }
    }
}
