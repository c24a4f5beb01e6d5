//! Child processes that never outlive the test process.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A spawned peer. Killed (and reaped) on drop; also killed by the kernel when
/// the test process dies, through `PR_SET_PDEATHSIG`.
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked exits, so every child
/// is forked from one thread that lives as long as the process.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testbed-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the testbed spawner thread");
        tx
    })
}

impl Process {
    /// Start `program` with `args`, stdout and stderr going to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> std::io::Result<Process> {
        Self::spawn_with_env(name, program, args, &[], log)
    }

    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> std::io::Result<Process> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .send((command, tx))
            .map_err(|_| std::io::Error::other("testbed spawner thread is gone"))?;
        let child = rx
            .recv()
            .map_err(|_| std::io::Error::other("testbed spawner thread is gone"))??;
        Ok(Process {
            name: name.to_owned(),
            child: Some(child),
            log: log.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(child) => !matches!(child.try_wait(), Ok(None)),
        }
    }

    /// Kill with SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Ask to stop with SIGTERM; SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: sending a signal to our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll `check` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`wait_for`], failing with `context()` (the state of the bed) added.
pub fn wait_or_explain<T>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, timeout, check)
    })) {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        ),
    }
}

/// Runs `body`, then `restore` whether it panicked or not (tests sharing a
/// bed put back what they changed), then goes on with the panic if any.
pub fn restoring<T>(body: impl FnOnce() -> T, restore: impl FnOnce()) -> T {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    restore();
    outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A free loopback port for a peer to listen on. Chosen below the kernel's
/// ephemeral range, so no outgoing connection (of which the tests open many) can
/// take it between this probe and the peer's bind; never the same port twice in
/// one test process; spread across processes by the pid.
pub fn free_port() -> u16 {
    const FLOOR: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ceiling = ephemeral_range_start();
    if ceiling < FLOOR + 1_000 {
        // An unusual range: let the kernel choose (the small race is back).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        return listener.local_addr().expect("local addr").port();
    }
    let span = ceiling - FLOOR;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let candidate = FLOOR + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(candidate).expect("ports below the ephemeral range fit u16");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FLOOR} and {ceiling}");
}

/// The first port the kernel hands out to outgoing connections.
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Whether something accepts TCP connections on the loopback port.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}
