//! A QMP client, just enough to read and set a QEMU device's properties (`qom-get`,
//! `qom-set`): QEMU's virtio-mem-pci is resized by setting its `requested-size`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A QMP connection in command mode.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    /// Connects to QEMU's `-qmp unix:PATH,server,wait=off` socket, waiting up to `timeout`
    /// for QEMU to create it, and leaves capabilities negotiation.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, String> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(stream) => break stream,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("QMP socket {}: {e}", path.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            return Err(format!("not a QMP greeting: {greeting}"));
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    /// Reads `property` of the QOM object at `path`.
    pub fn get(&mut self, path: &str, property: &str) -> Result<Value, String> {
        self.execute("qom-get", json!({"path": path, "property": property}))
    }

    /// Sets `property` of the QOM object at `path` to `value`.
    pub fn set(&mut self, path: &str, property: &str, value: Value) -> Result<(), String> {
        self.execute(
            "qom-set",
            json!({"path": path, "property": property, "value": value}),
        )
        .map(drop)
    }

    /// Runs `command` and returns what it returned; events that come first are skipped.
    fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, String> {
        let request = json!({"execute": command, "arguments": arguments});
        writeln!(self.writer, "{request}").map_err(|e| format!("QMP {command}: {e}"))?;
        loop {
            let mut reply = self.read()?;
            if let Some(error) = reply.get("error") {
                return Err(format!("QMP {command}: {error}"));
            }
            if let Some(value) = reply.get_mut("return") {
                return Ok(value.take());
            }
        }
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("QEMU closed its QMP socket".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("QMP: {e}: {line}")),
            Err(e) => Err(format!("QMP: {e}")),
        }
    }
}
