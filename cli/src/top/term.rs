//! The terminal of the live view: the alternate screen, redrawn in place; keys read as they
//! are typed (no Enter, no echo); and the terminal as it was on every way out, since
//! [`Terminal`] puts it back when dropped (after `q`, a signal, an error, a panic).
//!
//! Only canonical mode and echo go off: signals stay on (Ctrl-C is SIGINT, which the view
//! catches), and so does output processing (a newline still returns the carriage).

use std::io::{self, IsTerminal, Write};
use std::os::fd::AsFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

/// Enter the alternate screen, hide the cursor.
const ENTER: &str = "\x1b[?1049h\x1b[?25l";
/// Show the cursor, leave the alternate screen.
const LEAVE: &str = "\x1b[?25h\x1b[?1049l";
/// The cursor home; erase to the end of the line; erase below.
const HOME: &str = "\x1b[H";
const ERASE_LINE: &str = "\x1b[K";
const ERASE_BELOW: &str = "\x1b[J";

/// What typing asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// `q`, `Q`, or Ctrl-C as a byte (a terminal whose signals are off).
    Quit,
    /// Something else, or nothing within the time.
    Other,
}

/// The terminal while the view runs. Dropping it restores stdin's modes and leaves the
/// alternate screen.
#[derive(Debug)]
pub(crate) struct Terminal {
    /// stdin's modes before the view (`None`: stdin is not a terminal, keys are not read).
    saved: Option<Termios>,
    /// stdin can still give keys (not at its end).
    keys: bool,
}

impl Terminal {
    /// Takes the terminal: stdin (if a terminal) without canonical mode and echo, stdout on
    /// the alternate screen.
    ///
    /// # Errors
    /// Reading or setting stdin's modes, writing stdout.
    pub(crate) fn enter() -> io::Result<Terminal> {
        let stdin = io::stdin();
        let saved = if stdin.is_terminal() {
            let saved = termios::tcgetattr(stdin.as_fd())?;
            let mut keys = saved.clone();
            keys.local_flags
                .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::IEXTEN);
            keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
            keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
            termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &keys)?;
            Some(saved)
        } else {
            None
        };
        // Made before the first write: a failing write still restores the modes.
        let terminal = Terminal {
            keys: saved.is_some(),
            saved,
        };
        let mut out = io::stdout().lock();
        out.write_all(ENTER.as_bytes())?;
        out.flush()?;
        Ok(terminal)
    }

    /// Whether keys are read (stdin is a terminal, not at its end).
    pub(crate) fn reads_keys(&self) -> bool {
        self.keys
    }

    /// Draws `lines` over the screen, from its top: each cut to the terminal's width, and no
    /// more than its height (a line too many would scroll the screen).
    ///
    /// # Errors
    /// Writing stdout.
    pub(crate) fn draw(&mut self, lines: &[String]) -> io::Result<()> {
        let (rows, cols) = size().unwrap_or((usize::MAX, usize::MAX));
        let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 4).sum::<usize>() + 8);
        text.push_str(HOME);
        for line in lines.iter().take(rows.saturating_sub(1).max(1)) {
            match line.char_indices().nth(cols) {
                Some((end, _)) => text.push_str(&line[..end]),
                None => text.push_str(line),
            }
            text.push_str(ERASE_LINE);
            text.push('\n');
        }
        text.push_str(ERASE_BELOW);
        let mut out = io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()
    }

    /// Waits up to `timeout` for a key (sleeps the time when keys are not read).
    ///
    /// # Errors
    /// Polling or reading stdin (an interruption by a signal is no error: nothing came).
    pub(crate) fn key(&mut self, timeout: Duration) -> io::Result<Key> {
        if !self.keys {
            std::thread::sleep(timeout);
            return Ok(Key::Other);
        }
        let stdin = io::stdin();
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(Errno::EINTR) => return Ok(Key::Other),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let mut buf = [0u8; 64];
        match nix::unistd::read(stdin.as_fd(), &mut buf) {
            Ok(0) => {
                // Its end (a closed terminal): no more keys; Ctrl-C and signals still quit.
                self.keys = false;
                Ok(Key::Other)
            }
            Ok(n) => Ok(quits(&buf[..n])),
            Err(Errno::EINTR | Errno::EAGAIN) => Ok(Key::Other),
            Err(e) => Err(e.into()),
        }
    }
}

/// The terminal's rows and columns (`None`: stdout is no terminal, or it says 0).
fn size() -> Option<(usize, usize)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points to a live
    // local of that type for the call; an fd that is not a terminal makes it fail, no more.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0)
        .then(|| (usize::from(ws.ws_row), usize::from(ws.ws_col)))
}

/// Whether typed `bytes` ask to quit.
fn quits(bytes: &[u8]) -> Key {
    if bytes.iter().any(|&b| matches!(b, b'q' | b'Q' | 0x03)) {
        Key::Quit
    } else {
        Key::Other
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // Both, whatever fails: the screen first (so the shell's prompt lands on the normal
        // screen), then the modes.
        let mut out = io::stdout().lock();
        let _ = out.write_all(LEAVE.as_bytes());
        let _ = out.flush();
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_and_ctrl_c_quit_other_keys_do_not() {
        assert_eq!(quits(b"q"), Key::Quit);
        assert_eq!(quits(b"xQ"), Key::Quit);
        assert_eq!(quits(&[0x03]), Key::Quit);
        assert_eq!(quits(b"\x1b[A"), Key::Other);
        assert_eq!(quits(b""), Key::Other);
    }
}
