//! Running a program the initramfs carries (`/nvme`, `/edu_dma`) as a user would: a separate
//! process, its output drained on threads (a chatty child cannot block on a full pipe) and
//! logged as INFO lines, killed if it runs past a timeout.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::failure::{Context, Failure};

/// What one run printed and how it ended.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `program` with `args`, waiting up to `timeout`; its output goes to the log as
/// `INFO <tag> <label>: …` lines.
pub(crate) fn run(
    program: &str,
    tag: &str,
    label: &str,
    args: &[String],
    timeout: Duration,
) -> Result<Run, Failure> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(|| format!("start {program} {}", args.join(" ")))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context(|| format!("wait for {program}"))? {
            break status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::Check(format!(
                "{program} {} did not finish within {timeout:?}",
                args.join(" ")
            )));
        }
        thread::sleep(Duration::from_millis(20));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    for line in stdout.lines().chain(stderr.lines()) {
        println!("INFO {tag} {label}: {line}");
    }
    println!(
        "INFO {tag} {label}: {status} after {} ms",
        start.elapsed().as_millis()
    );
    Ok(Run {
        status,
        stdout,
        stderr,
    })
}
